-- A cluster's shared state (issue "Outgrow one machine"): `bulkhead node` daemons register and
-- report themselves here, and the replicas that need one owner at a time (node health, object
-- GC, pool targets) take lease rows. Portable between SQLite and PostgreSQL like the earlier
-- migrations: TEXT and BIGINT only, timestamps as unix milliseconds (given by the caller).

CREATE TABLE nodes (
    id             TEXT PRIMARY KEY,
    -- 1 at the first registration, +1 at every later one and when the sweep declares the node
    -- dead; calls carrying an older epoch come from an older incarnation and are refused.
    epoch          BIGINT NOT NULL,
    -- Where the control plane reaches the node.
    addr           TEXT NOT NULL,
    -- ready | draining | suspect | dead
    status         TEXT NOT NULL,
    -- The node's last report (capacity, warm pools, cached templates, …) as JSON.
    report         TEXT NOT NULL,
    -- When the registration that gave it this epoch happened.
    registered_at  BIGINT NOT NULL,
    -- Its last registration or accepted heartbeat.
    heartbeat_at   BIGINT NOT NULL
);
-- The sweep looks for live nodes whose heartbeat is older than a threshold.
CREATE INDEX nodes_status_heartbeat ON nodes (status, heartbeat_at);

-- One row per lease, never deleted: the epoch only grows, so a fencing token is never reused.
CREATE TABLE leases (
    name        TEXT PRIMARY KEY,
    -- Who took it last (kept after expiry or release).
    holder      TEXT NOT NULL,
    -- +1 whenever the lease changes hands; kept while one holder renews it.
    epoch       BIGINT NOT NULL,
    -- Free from this instant on.
    expires_at  BIGINT NOT NULL
);
