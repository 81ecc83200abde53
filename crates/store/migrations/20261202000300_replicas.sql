-- Several API replicas over one database (issue "Outgrow one machine"): each `bulkhead api`
-- registers here and heartbeats every second; a replica is live while its heartbeat is young.
-- A sandbox is driven by one replica, its owner (NULL under `bulkhead serve`, where one process
-- drives everything); the other replicas forward its requests there and take it over when the
-- owner's heartbeat stops. Portable like the earlier migrations: TEXT and BIGINT only,
-- timestamps as unix milliseconds given by the caller.

CREATE TABLE replicas (
    id            TEXT PRIMARY KEY,
    -- The URL the other replicas forward requests to.
    addr          TEXT NOT NULL,
    -- 1 at the first registration, +1 at every later one: a heartbeat of an older incarnation
    -- (or of one that was silent long enough to lose its sandboxes) is refused.
    epoch         BIGINT NOT NULL,
    heartbeat_at  BIGINT NOT NULL
);
CREATE INDEX replicas_heartbeat ON replicas (heartbeat_at);

ALTER TABLE sandboxes ADD COLUMN owner_replica TEXT;
CREATE INDEX sandboxes_owner_replica ON sandboxes (owner_replica, state);
