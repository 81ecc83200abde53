-- Zero-trust egress: per-sandbox network policy, write-only secrets, and the egress audit trail.
-- Portable between SQLite and PostgreSQL like the initial migration: TEXT and BIGINT only,
-- booleans as 0/1, timestamps as unix milliseconds.

-- 1 when the sandbox may reach the internet outside allowOut (E2B `allow_internet_access`).
ALTER TABLE sandboxes ADD COLUMN allow_internet BIGINT NOT NULL DEFAULT 0;
-- The sandbox's network config as JSON (allowOut, denyOut, rules); NULL = none given.
ALTER TABLE sandboxes ADD COLUMN network TEXT;

CREATE TABLE secrets (
    id          TEXT PRIMARY KEY,
    -- Unique per deployment (E2B: per project); referenced as ${e2b.secrets.<name>}.
    name        TEXT NOT NULL UNIQUE,
    -- Never returned by the API; read only by the egress proxy when it injects headers.
    value       TEXT NOT NULL,
    -- Bumped on every value update (E2B `currentVersion`).
    version     BIGINT NOT NULL,
    metadata    TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);

-- One row per egress decision (a connection, a DNS answer or an injected request). No foreign
-- key: the trail outlives the sandbox row.
CREATE TABLE egress_events (
    sandbox_id  TEXT NOT NULL,
    at          BIGINT NOT NULL,
    -- tcp | tls | http | dns
    protocol    TEXT NOT NULL,
    host        TEXT,
    ip          TEXT,
    port        BIGINT NOT NULL,
    allowed     BIGINT NOT NULL,
    -- Why: the matching allowOut/denyOut entry, "default-deny", "fixed-deny", "mismatch", ...
    rule        TEXT NOT NULL,
    bytes_out   BIGINT NOT NULL,
    bytes_in    BIGINT NOT NULL
);
CREATE INDEX egress_events_sandbox_at ON egress_events (sandbox_id, at);
CREATE INDEX egress_events_at ON egress_events (at);
