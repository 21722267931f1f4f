-- key_created says whether the write recorded in idempotency_key created the order
-- (1) or replaced it (0), so that a keyed PUT re-rendered by the backstop (its
-- idempotency record lost) answers what it answered the first time: 201 + Location or
-- 200. created = updated cannot tell: a replace in the second of the creation keeps
-- them equal. Rows written before this column existed get that best guess.
ALTER TABLE orders ADD COLUMN key_created INTEGER NOT NULL DEFAULT 1;

UPDATE orders SET key_created = (created = updated);
