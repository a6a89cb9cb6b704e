-- The audit log: every change a person, a script or the service made, in one hash chain.
-- Entry `seq` carries `hash = SHA-256(prev_hash ‖ canonical JSON of the entry)`, where
-- `prev_hash` is the hash of entry `seq - 1` (32 zero bytes before the first), so that an
-- edited, removed or inserted entry breaks the chain from there on (see `domain::audit`).
CREATE TABLE audit_log (
    seq         bigint PRIMARY KEY,
    at          timestamptz NOT NULL,
    actor_kind  text NOT NULL CHECK (actor_kind IN ('token', 'user', 'system')),
    actor_id    text NOT NULL,
    actor_name  text NOT NULL,
    action      text NOT NULL,
    entity      text NOT NULL,
    entity_id   text NOT NULL,
    before      jsonb,
    after       jsonb,
    prev_hash   bytea NOT NULL CHECK (length(prev_hash) = 32),
    hash        bytea NOT NULL CHECK (length(hash) = 32)
);
CREATE INDEX audit_log_entity ON audit_log (entity, entity_id, seq);
CREATE INDEX audit_log_actor ON audit_log (actor_id, seq);
CREATE INDEX audit_log_at ON audit_log (at, seq);

-- The chain's head: the last seq handed out and its hash. An appender's
-- `UPDATE audit_head SET seq = seq + 1` takes this one row's lock, which it holds until its
-- transaction ends, so appenders take seqs one after the other and commit in seq order: the
-- log has no gap and a reader paging by seq never skips an entry committed later.
CREATE TABLE audit_head (
    id   boolean PRIMARY KEY DEFAULT true CHECK (id),
    seq  bigint NOT NULL,
    hash bytea NOT NULL CHECK (length(hash) = 32)
);
INSERT INTO audit_head (id, seq, hash) VALUES (true, 0, '\x0000000000000000000000000000000000000000000000000000000000000000');

-- Entries are written once: the service never edits or removes one, and nobody else can
-- through it.
CREATE FUNCTION audit_log_is_append_only() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER audit_log_no_change
    BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_is_append_only();
CREATE TRIGGER audit_log_no_truncate
    BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_is_append_only();
