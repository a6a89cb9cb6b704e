-- Budget alerts and their delivery. An alert fires at most once per (project, month,
-- threshold, kind), whatever path re-evaluates spend: the unique key decides, not the
-- application. Each alert is stored together with its outbox row, in the transaction that
-- fires it; the delivery worker sends it later, at least once, surviving restarts.

CREATE TABLE alert_events (
    project_id text NOT NULL REFERENCES projects (id),
    id         uuid NOT NULL,
    month      date NOT NULL,
    threshold  integer NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('actual', 'forecast')),
    currency   char(3) NOT NULL,
    spend      numeric NOT NULL,
    budget     numeric NOT NULL,
    burn_pct   numeric NOT NULL,
    forecast   numeric,
    fired_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, id),
    CONSTRAINT alert_events_once UNIQUE (project_id, month, threshold, kind)
);

-- The outbox: one row per alert to deliver. `body` holds the exact bytes that are signed and
-- sent, so every retry sends the same document.
CREATE TABLE alert_deliveries (
    project_id      text NOT NULL,
    alert_id        uuid NOT NULL,
    url             text NOT NULL,
    body            text NOT NULL,
    state           text NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'delivered', 'gave_up')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    PRIMARY KEY (project_id, alert_id),
    FOREIGN KEY (project_id, alert_id) REFERENCES alert_events (project_id, id)
);
CREATE INDEX alert_deliveries_due ON alert_deliveries (next_attempt_at) WHERE state = 'pending';

-- Every attempt to deliver, as `GET /v1/alerts` shows it.
CREATE TABLE alert_delivery_attempts (
    project_id   text NOT NULL,
    alert_id     uuid NOT NULL,
    attempt      integer NOT NULL,
    attempted_at timestamptz NOT NULL,
    status_code  integer,
    error        text,
    duration_ms  integer NOT NULL,
    PRIMARY KEY (project_id, alert_id, attempt),
    FOREIGN KEY (project_id, alert_id) REFERENCES alert_deliveries (project_id, alert_id)
);
