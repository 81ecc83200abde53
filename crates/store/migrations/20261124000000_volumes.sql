-- E2B volumes: persistent, named directories a sandbox mounts at create (`volumeMounts`).
-- Portable between SQLite and PostgreSQL like the earlier migrations: TEXT and BIGINT only,
-- timestamps as unix milliseconds.

CREATE TABLE volumes (
    id            TEXT PRIMARY KEY,
    -- The owning team; '' on a server without teams (every key is one team).
    team          TEXT NOT NULL,
    -- Unique per team: `volumeMounts` names a volume by it.
    name          TEXT NOT NULL,
    -- The API key that created it.
    owner_key_id  TEXT NOT NULL,
    -- Bearer token of the volume content API (E2B `VolumeAndToken.token`); returned by
    -- `GET /volumes/{id}` like E2B does, so it is kept as given (like envd access tokens).
    token         TEXT NOT NULL,
    -- Size limit of the volume's filesystem in bytes.
    max_bytes     BIGINT NOT NULL,
    created_at    BIGINT NOT NULL,
    UNIQUE (team, name)
);

-- Which sandbox mounts which volume where. A volume is in use while a row points to it from a
-- sandbox that is not dead. No foreign keys: dead sandboxes are deleted on their own schedule.
CREATE TABLE sandbox_volumes (
    sandbox_id  TEXT NOT NULL,
    volume_id   TEXT NOT NULL,
    path        TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, path)
);
CREATE INDEX sandbox_volumes_volume ON sandbox_volumes (volume_id);
