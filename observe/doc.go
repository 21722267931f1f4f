// Package observe holds what an observer of idem is told (SPEC §15): the [Observer]
// struct of optional funcs, one per event, and the events themselves with their
// label-safe enums ([Outcome], [CompletionResult], [StoreOp], ...). Set an Observer
// as idem.Config.Observer or idem.GuardConfig.Observer; [Multi] tells several.
//
// The adapters idemprom (Prometheus) and idemotel (OpenTelemetry) are built on it;
// write your own here too. A handler author needs none of it. It imports the standard
// library only. docs/architecture.md shows where it sits among idem's layers.
package observe
