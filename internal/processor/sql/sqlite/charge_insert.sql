INSERT INTO processor_charges (id, amount, currency, idempotency_key, created)
VALUES (?1, ?2, ?3, ?4, ?5);
