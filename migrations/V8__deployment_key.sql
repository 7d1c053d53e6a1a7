-- One secret per deployment, for keyed hashes of personal data in logs (the recipient's
-- `to_hmac`): the same for every process, so lines about one address correlate across
-- processes, and never logged, so a hash in a log cannot be checked against a guessed
-- address by whoever reads the log. The first process that needs the key inserts 32 random
-- bytes (ON CONFLICT DO NOTHING); every process reads the one row.
CREATE TABLE deployment_key (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    log_hmac_key bytea NOT NULL CHECK (octet_length(log_hmac_key) = 32),
    created_at timestamptz NOT NULL DEFAULT now()
);
