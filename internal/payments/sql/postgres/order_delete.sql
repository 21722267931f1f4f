DELETE FROM orders
WHERE scope = $1 AND id = $2;
