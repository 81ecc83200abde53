-- Portable between SQLite and PostgreSQL: TEXT, BIGINT and plain indexes only.
-- Timestamps are unix milliseconds (BIGINT); string maps are JSON objects in TEXT.

CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    -- Lowercase hex SHA-256 of the full key; the key itself is never stored.
    hash        TEXT NOT NULL UNIQUE,
    prefix      TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    revoked_at  BIGINT
);
CREATE INDEX api_keys_prefix ON api_keys (prefix);

CREATE TABLE sandboxes (
    id                 TEXT PRIMARY KEY,
    template_id        TEXT NOT NULL,
    alias              TEXT,
    -- running | paused | dead
    state              TEXT NOT NULL,
    -- No foreign key: keys are revoked, never deleted, and internal callers may own sandboxes.
    owner_key_id       TEXT NOT NULL,
    metadata           TEXT NOT NULL,
    env_vars           TEXT NOT NULL,
    envd_access_token  TEXT,
    cpu_count          BIGINT NOT NULL,
    memory_mb          BIGINT NOT NULL,
    disk_size_mb       BIGINT NOT NULL,
    started_at         BIGINT NOT NULL,
    end_at             BIGINT NOT NULL,
    driver_handle      TEXT,
    end_reason         TEXT
);
-- Keyset pagination walks (started_at, id); listings usually filter on state first.
CREATE INDEX sandboxes_started ON sandboxes (started_at, id);
CREATE INDEX sandboxes_state_started ON sandboxes (state, started_at, id);
CREATE INDEX sandboxes_state_end ON sandboxes (state, end_at);

CREATE TABLE templates (
    id            TEXT PRIMARY KEY,
    alias         TEXT UNIQUE,
    content_hash  TEXT NOT NULL,
    -- building | ready | error
    status        TEXT NOT NULL,
    rootfs_path   TEXT NOT NULL,
    cpu_count     BIGINT NOT NULL,
    memory_mb     BIGINT NOT NULL,
    disk_size_mb  BIGINT NOT NULL,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL
);
