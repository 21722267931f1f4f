-- Newest first; the page after the charge whose seq is ?1 (0: from the newest).
SELECT id, amount, currency, idempotency_key, created
FROM processor_charges
WHERE ?1 = 0 OR seq < ?1
ORDER BY seq DESC
LIMIT ?2;
