package seal

import "time"

// SetClock sets the clock of k's retries of refused data keys.
func SetClock(k *Keyring, now func() time.Time) { k.now = now }
