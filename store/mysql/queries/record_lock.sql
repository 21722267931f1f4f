WHERE scope = ? AND `key` = ?
FOR UPDATE
