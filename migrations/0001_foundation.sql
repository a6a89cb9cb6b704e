-- Projects, budgets, access tokens, pricing contracts, FX rates and job records.
-- Tables that grow with usage lead their keys with the project, so they can be distributed
-- by project (Citus) when one server is no longer enough.

CREATE TABLE projects (
    id                     text PRIMARY KEY CHECK (id ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    name                   text NOT NULL,
    team                   text,
    currency               char(3) NOT NULL,
    default_monthly_budget numeric CHECK (default_monthly_budget > 0),
    alert_thresholds       integer[] NOT NULL DEFAULT '{50,80,100}',
    webhook_url            text,
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE budgets (
    project_id text NOT NULL REFERENCES projects (id),
    month      date NOT NULL CHECK (extract(day FROM month) = 1),
    amount     numeric NOT NULL CHECK (amount > 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, month)
);

CREATE TABLE api_tokens (
    id            uuid PRIMARY KEY,
    name          text NOT NULL,
    role          text NOT NULL CHECK (role IN ('admin', 'finance', 'reader', 'ingest')),
    projects      text[] NOT NULL DEFAULT '{}',
    secret_sha256 bytea NOT NULL UNIQUE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);

-- Server-wide values generated once and shared by every replica (e.g. the webhook secret).
CREATE TABLE settings (
    key   text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE contracts (
    id                 uuid PRIMARY KEY,
    name               text NOT NULL,
    gpu_model          text NOT NULL,
    billing_mode       text NOT NULL CHECK (billing_mode IN ('on_demand', 'spot', 'reserved')),
    price_per_gpu_hour numeric NOT NULL CHECK (price_per_gpu_hour > 0),
    currency           char(3) NOT NULL,
    valid_from         timestamptz NOT NULL,
    valid_until        timestamptz CHECK (valid_until > valid_from),
    project_id         text REFERENCES projects (id),
    provider           text,
    region             text,
    committed_gpus     numeric CHECK (committed_gpus > 0),
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CHECK (committed_gpus IS NULL OR billing_mode = 'reserved')
);
CREATE INDEX contracts_by_model ON contracts (gpu_model, billing_mode);

CREATE TABLE fx_rates (
    month         date NOT NULL CHECK (extract(day FROM month) = 1),
    from_currency char(3) NOT NULL,
    to_currency   char(3) NOT NULL,
    rate          numeric NOT NULL CHECK (rate > 0),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (month, from_currency, to_currency)
);

-- One row per (project, task, attempt): the permanent key that makes ingestion idempotent,
-- whatever the record's time. `content_hash` is the SHA-256 of the canonical record, so a
-- re-post is told apart from a changed one without comparing every column.
CREATE TABLE job_records (
    project_id       text NOT NULL REFERENCES projects (id),
    task_id          text NOT NULL,
    attempt          integer NOT NULL CHECK (attempt >= 1),
    version          integer NOT NULL DEFAULT 1,
    gpu_model        text NOT NULL,
    gpu_count        numeric NOT NULL CHECK (gpu_count > 0),
    billing_mode     text NOT NULL CHECK (billing_mode IN ('on_demand', 'spot', 'reserved')),
    provider         text,
    region           text,
    queued_at        timestamptz,
    started_at       timestamptz NOT NULL,
    ended_at         timestamptz NOT NULL CHECK (ended_at >= started_at),
    gpu_seconds_held numeric NOT NULL CHECK (gpu_seconds_held >= 0),
    gpu_seconds_busy numeric CHECK (gpu_seconds_busy >= 0 AND gpu_seconds_busy <= gpu_seconds_held),
    outcome          text NOT NULL CHECK (outcome IN ('completed', 'failed', 'cancelled', 'preempted')),
    retries          integer NOT NULL DEFAULT 0 CHECK (retries >= 0),
    failures         integer NOT NULL DEFAULT 0 CHECK (failures >= 0),
    output_quantity  numeric CHECK (output_quantity >= 0),
    output_unit      text,
    labels           jsonb NOT NULL DEFAULT '{}',
    content_hash     bytea NOT NULL,
    ingested_at      timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, task_id, attempt)
);
CREATE INDEX job_records_by_start ON job_records (project_id, started_at, task_id, attempt);

-- Every version a correction replaced, with who replaced it and when.
CREATE TABLE job_record_versions (
    project_id   text NOT NULL,
    task_id      text NOT NULL,
    attempt      integer NOT NULL,
    version      integer NOT NULL,
    record       jsonb NOT NULL,
    recorded_at  timestamptz NOT NULL,
    replaced_by  uuid,
    replaced_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, task_id, attempt, version),
    FOREIGN KEY (project_id, task_id, attempt) REFERENCES job_records (project_id, task_id, attempt)
);
