-- Templates belong to a team (issue 22): a template built through the API is its team's, and
-- its name is unique within that team only; built-in templates (registered by the server at
-- start) have no team (NULL) and are public. Portable between SQLite and PostgreSQL: SQLite
-- cannot drop the old UNIQUE on `alias`, so the table is rebuilt.

CREATE TABLE templates_new (
    id            TEXT PRIMARY KEY,
    alias         TEXT,
    content_hash  TEXT NOT NULL,
    -- building | ready | error
    status        TEXT NOT NULL,
    rootfs_path   TEXT NOT NULL,
    cpu_count     BIGINT NOT NULL,
    memory_mb     BIGINT NOT NULL,
    disk_size_mb  BIGINT NOT NULL,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    -- NULL: a built-in template, startable by every team.
    team_id       TEXT
);

-- Rows saved before this change: built-ins are registered again at every start (which sets
-- their team back to NULL); the others were built through the API by keys that, before
-- teams, were all the seeded default team's.
INSERT INTO templates_new (id, alias, content_hash, status, rootfs_path, cpu_count, memory_mb,
                           disk_size_mb, created_at, updated_at, team_id)
SELECT id, alias, content_hash, status, rootfs_path, cpu_count, memory_mb, disk_size_mb,
       created_at, updated_at, 'default'
FROM templates;

DROP TABLE templates;
ALTER TABLE templates_new RENAME TO templates;

-- A name is unique within its team (NULLs, the built-ins, are distinct: the engine keeps
-- built-in names reserved).
CREATE UNIQUE INDEX templates_team_alias ON templates (team_id, alias);
