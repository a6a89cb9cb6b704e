-- Notification channels: Slack, Microsoft Teams, email, PagerDuty and signed webhooks that
-- alerts (and month closes) go to besides a project's own webhook_url. A channel is global:
-- `projects` and `alert_kinds` narrow what it receives (NULL: everything). A deleted channel
-- is kept, marked, so the deliveries already made still name it.
CREATE TABLE channels (
    id          uuid PRIMARY KEY,
    name        text NOT NULL,
    kind        text NOT NULL
                CHECK (kind IN ('slack', 'teams', 'email', 'pagerduty', 'webhook')),
    -- An incoming-webhook URL, PagerDuty's events URL, or the email addresses, comma-separated.
    target      text NOT NULL,
    -- PagerDuty's integration (routing) key; NULL for the other kinds.
    routing_key text,
    projects    text[],
    alert_kinds text[],
    created_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz,
    CHECK ((kind = 'pagerduty') = (routing_key IS NOT NULL))
);

-- The channels' outbox: one row per message and channel. A message is an alert (its project
-- and id) or a closed month (project '' and a message id of its own). `body` holds what was
-- decided when it was queued (the notice as JSON, and a month close's CSV), so every retry
-- sends the same message.
CREATE TABLE channel_deliveries (
    project_id      text NOT NULL,
    message_id      uuid NOT NULL,
    channel_id      uuid NOT NULL REFERENCES channels (id),
    body            jsonb NOT NULL,
    state           text NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'delivered', 'gave_up', 'cancelled')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    PRIMARY KEY (project_id, message_id, channel_id)
);
CREATE INDEX channel_deliveries_due ON channel_deliveries (next_attempt_at)
    WHERE state = 'pending';
CREATE INDEX channel_deliveries_of_channel ON channel_deliveries (channel_id, created_at);

-- Every attempt, as the alert listing and the channel page show them.
CREATE TABLE channel_delivery_attempts (
    project_id   text NOT NULL,
    message_id   uuid NOT NULL,
    channel_id   uuid NOT NULL,
    attempt      integer NOT NULL,
    attempted_at timestamptz NOT NULL,
    status_code  integer,
    error        text,
    duration_ms  integer NOT NULL,
    PRIMARY KEY (project_id, message_id, channel_id, attempt),
    FOREIGN KEY (project_id, message_id, channel_id)
        REFERENCES channel_deliveries (project_id, message_id, channel_id)
);
