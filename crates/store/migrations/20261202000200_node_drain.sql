-- Draining a node (issue "Outgrow one machine"): `bulkhead node drain` asks through the store
-- (the node reports `draining` from its next heartbeat on; a registration starts it afresh), and
-- the API replicas pause what runs there. A sandbox paused by a drain resumes on its next
-- request, as with E2B's auto-resume, whatever its own lifecycle says: its user never paused it.
ALTER TABLE nodes ADD COLUMN drain BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sandbox_persistence ADD COLUMN resume_on_traffic BIGINT NOT NULL DEFAULT 0;
