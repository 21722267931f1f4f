// Package sqlstore is what the database/sql stores (store/sqlite, store/mysql) share:
// scanning records and listed records from their columns, the decisions a claim makes
// before it writes, the order of the SPEC §7 helpers around a transaction (InTx, Step,
// Respond's completion) and the bookkeeping of embedded migrations. Each store keeps
// its own SQL, its own transactions and its own error normalisation; what it hands
// here are functions.
package sqlstore
