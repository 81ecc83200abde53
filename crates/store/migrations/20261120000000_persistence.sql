-- Persistence: pause/resume, lifecycle settings, snapshots. Portable like the other migrations
-- (TEXT and BIGINT only, booleans as 0/1, timestamps as unix milliseconds). Kept in tables of
-- their own so the `sandboxes` row stays what every sandbox has.

-- One row per sandbox created since persistence existed (older sandboxes read as the defaults:
-- kill on timeout, no auto-resume).
CREATE TABLE sandbox_persistence (
    sandbox_id         TEXT PRIMARY KEY,
    -- kill | pause: what the TTL's end does (E2B `autoPause`, `lifecycle.on_timeout`).
    on_timeout         TEXT NOT NULL,
    -- 1: a paused sandbox resumes on its first envd request (E2B `autoResume.enabled`).
    auto_resume        BIGINT NOT NULL,
    -- 1: an auto-pause keeps memory (E2B `autoPauseMemory`).
    pause_memory       BIGINT NOT NULL,
    -- The TTL the sandbox was created with, for resumes that give none (auto-resume).
    timeout_ms         BIGINT NOT NULL,
    -- The checkpoint a paused (or pausing) sandbox resumes from; NULL while it runs. A
    -- checkpoint is complete only when its directory holds the engine's completion marker.
    checkpoint_dir     TEXT,
    -- 1: the checkpoint has memory and processes; 0: filesystem only.
    checkpoint_memory  BIGINT NOT NULL DEFAULT 0,
    -- Bumped by every pause; names the checkpoint directory, so none is ever reused.
    generation         BIGINT NOT NULL DEFAULT 0,
    -- When the last pause completed (retention is counted from it).
    paused_at          BIGINT
);

-- Snapshots (E2B: a snapshot is a template; sandboxes created from it restore its checkpoint).
CREATE TABLE snapshots (
    id              TEXT PRIMARY KEY,
    -- Optional unique name (without namespace or tag).
    name            TEXT UNIQUE,
    -- The sandbox it was taken from, and that sandbox's template (the restore's base).
    sandbox_id      TEXT NOT NULL,
    template_id     TEXT NOT NULL,
    checkpoint_dir  TEXT NOT NULL,
    memory          BIGINT NOT NULL,
    -- The source sandbox's env vars as JSON (a filesystem-only restore boots with them).
    env_vars        TEXT NOT NULL,
    -- The source's envd access token: a memory restore's agent still requires it until the
    -- engine gives the new sandbox its own.
    envd_access_token TEXT,
    created_at      BIGINT NOT NULL
);
CREATE INDEX snapshots_created ON snapshots (created_at, id);
CREATE INDEX snapshots_sandbox ON snapshots (sandbox_id);
