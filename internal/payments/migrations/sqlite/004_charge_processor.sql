-- A charge made through a card processor (idem payments --processor-url, SPEC §13)
-- keeps the processor's charge id; NULL for a charge made without one, and while the
-- charge is pending (recorded before the processor was called).
ALTER TABLE charges ADD COLUMN processor_charge_id TEXT;
