-- Idempotent creates (issue 25): a `POST /sandboxes` carrying an `Idempotency-Key` header makes at
-- most one sandbox per (team, key), whichever API replica each attempt reaches, because the
-- replicas share this table. A request claims the key by inserting its row (the primary key
-- lets one insert win), creates, then writes the sandbox id; a failed create deletes the row so
-- a retry can create again. Portable between SQLite and PostgreSQL like the earlier migrations:
-- TEXT and BIGINT only, timestamps as unix milliseconds (given by the caller).

CREATE TABLE idempotency_keys (
    -- The caller's team: keys of different teams never meet.
    team_id           TEXT NOT NULL,
    -- The header's value (1 to 255 visible ASCII characters, checked by the engine).
    idem_key          TEXT NOT NULL,
    -- SHA-256 of the normalized create request: the same key with another request is refused.
    fingerprint       TEXT NOT NULL,
    -- Random per attempt: only the attempt holding the claim completes, renews or releases it.
    claim_token       TEXT NOT NULL,
    -- NULL while the create is in flight; the sandbox it made once it succeeded.
    sandbox_id        TEXT,
    created_at        BIGINT NOT NULL,
    -- A pending claim not renewed by then was abandoned (its replica died mid-create): the next
    -- request with the key takes it over.
    claim_expires_at  BIGINT NOT NULL,
    -- The key is forgotten from then on (24 h after its claim); expired rows are deleted lazily.
    expires_at        BIGINT NOT NULL,
    PRIMARY KEY (team_id, idem_key)
);
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
