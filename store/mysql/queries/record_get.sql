WHERE scope = ? AND `key` = ?
