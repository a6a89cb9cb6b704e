-- People signed in through the organisation's OpenID Connect provider.
--
-- A sign-in under way: the browser was sent to the provider and comes back to
-- /auth/callback with `state`. Kept until it returns or ten minutes pass; the PKCE verifier
-- and the nonce never leave the server.
CREATE TABLE sign_in_attempts (
    state_sha256  bytea PRIMARY KEY,
    nonce         text NOT NULL,
    pkce_verifier text NOT NULL,
    return_to     text NOT NULL,
    created_at    timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL
);
CREATE INDEX sign_in_attempts_expiry ON sign_in_attempts (expires_at);

-- A signed-in person's session. The cookie holds a random secret; only its SHA-256 is
-- stored, as for API tokens. The role and projects are what the provider's claim mapped to
-- when the person signed in; `csrf_token` must accompany every write the session makes.
CREATE TABLE sign_in_sessions (
    secret_sha256 bytea PRIMARY KEY,
    subject       text NOT NULL,
    name          text NOT NULL,
    role          text NOT NULL CHECK (role IN ('admin', 'finance', 'reader')),
    projects      text[] NOT NULL,
    csrf_token    text NOT NULL,
    created_at    timestamptz NOT NULL,
    last_seen_at  timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL
);
CREATE INDEX sign_in_sessions_expiry ON sign_in_sessions (expires_at);
