-- Teams (E2B's model): every API key belongs to one, sandboxes are visible to every key of
-- their team, and limits, credits and usage attach to it. Portable between SQLite and
-- PostgreSQL like the earlier migrations: TEXT and BIGINT only, timestamps as unix ms.

CREATE TABLE teams (
    id                 TEXT PRIMARY KEY,
    name               TEXT NOT NULL UNIQUE,
    created_at         BIGINT NOT NULL,
    -- Balance in millionths of a credit; NULL: the team has no balance (never refused for
    -- credits, still metered).
    credits_micro      BIGINT,
    -- Quotas; NULL: no team limit (the server's own limits still apply).
    max_sandboxes      BIGINT,
    max_vcpus          BIGINT,
    max_memory_mb      BIGINT,
    max_timeout_secs   BIGINT,
    -- Token bucket of creates: refill rate in thousandths of a create per second, and size.
    create_rate_milli  BIGINT,
    create_burst       BIGINT
);

-- Keys and sandboxes that existed before teams (and the BULKHEAD_API_KEY seed) land here.
INSERT INTO teams (id, name, created_at) VALUES ('default', 'default', 0);

ALTER TABLE api_keys ADD COLUMN team_id TEXT NOT NULL DEFAULT 'default';
-- Unix ms of the last request with the key, written at most once a minute per key.
ALTER TABLE api_keys ADD COLUMN last_used_at BIGINT;

-- The team owns the sandbox (not the key: a revoked key's sandboxes stay the team's).
ALTER TABLE sandboxes ADD COLUMN team_id TEXT NOT NULL DEFAULT 'default';
CREATE INDEX sandboxes_team ON sandboxes (team_id, state);

-- Snapshots are the team's too (E2B: a snapshot is a template of the team).
ALTER TABLE snapshots ADD COLUMN team_id TEXT NOT NULL DEFAULT 'default';

-- Volumes already had a team column: '' meant "a server without teams".
UPDATE volumes SET team = 'default' WHERE team = '';

-- Metered usage: one row per sandbox per metering interval (or part of one, at its end).
CREATE TABLE usage_records (
    sandbox_id      TEXT NOT NULL,
    team_id         TEXT NOT NULL,
    key_id          TEXT NOT NULL,
    start_ms        BIGINT NOT NULL,
    end_ms          BIGINT NOT NULL,
    -- running | paused
    state           TEXT NOT NULL,
    -- vCPUs × ms running; MiB of memory limit × ms running; MiB of checkpoint × ms paused.
    vcpu_ms         BIGINT NOT NULL,
    memory_mib_ms   BIGINT NOT NULL,
    storage_mib_ms  BIGINT NOT NULL,
    -- What the interval cost, in millionths of a credit (0 without prices).
    cost_micro      BIGINT NOT NULL,
    PRIMARY KEY (sandbox_id, start_ms)
);
CREATE INDEX usage_records_team_time ON usage_records (team_id, end_ms);
