-- Secrets belong to a team (issue 22): a name is unique within its team only, every verb sees
-- the caller's team, and a sandbox's header rules resolve in the sandbox's team. Values are
-- encrypted at rest (XChaCha20-Poly1305 under a key kept outside the database); rows written
-- before this change are plain text until the server's first start with a key seals them
-- (`sealed` 0 → 1). Portable between SQLite and PostgreSQL: SQLite cannot drop the old UNIQUE
-- on `name`, so the table is rebuilt.

CREATE TABLE secrets_new (
    id          TEXT PRIMARY KEY,
    team_id     TEXT NOT NULL,
    -- Unique per team (E2B: per team too); referenced as ${e2b.secrets.<name>}.
    name        TEXT NOT NULL,
    -- sealed = 1: base64 of nonce ‖ ciphertext, bound to (team_id, id); 0: plain text from
    -- before encryption (sealed at the next start). Never returned by the API.
    value       TEXT NOT NULL,
    sealed      BIGINT NOT NULL DEFAULT 0,
    -- Bumped on every value update (E2B `currentVersion`).
    version     BIGINT NOT NULL,
    metadata    TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    UNIQUE (team_id, name)
);

-- Before teams had secrets every key was the seeded default team's.
INSERT INTO secrets_new (id, team_id, name, value, sealed, version, metadata, created_at,
                         updated_at)
SELECT id, 'default', name, value, 0, version, metadata, created_at, updated_at
FROM secrets;

DROP TABLE secrets;
ALTER TABLE secrets_new RENAME TO secrets;
CREATE INDEX secrets_team_created ON secrets (team_id, created_at, id);

-- What the secrets key is checked against at start: a known text sealed with it. A start with
-- another key (a lost or replaced key file) is refused instead of serving secrets it cannot
-- decrypt. One row, id 'current'.
CREATE TABLE secrets_key_check (
    id          TEXT PRIMARY KEY,
    sealed      TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
