package grpcidem

import (
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ErrorDomain is the domain of the [errdetails.ErrorInfo] that every status this
// package produces carries. Its Reason is the SPEC §9 code in upper case
// ("KEY_REUSED"), and its metadata holds the code as idem writes it
// ({"code": "key_reused"}), so that clients classify errors by code, never by
// message.
const ErrorDomain = "idem.dev"

// newStatus returns the status error with code c for idem's error code: an ErrorInfo
// naming it and, when retryAfter is positive, a RetryInfo with that delay.
func newStatus(c codes.Code, code, msg string, retryAfter time.Duration) error {
	st := status.New(c, "grpcidem: "+msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: strings.ToUpper(code), Domain: ErrorDomain, Metadata: map[string]string{"code": code}}}
	if retryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}

// ErrorCode returns the SPEC §9 code of a status error this package produced
// ("key_reused", "request_in_progress", …), or "" for any other error.
func ErrorCode(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info.GetMetadata()["code"]
		}
	}
	return ""
}

// RetryDelay returns the delay of the RetryInfo that err's status carries, and
// whether it carries one.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.RetryInfo); ok && info.GetRetryDelay().IsValid() {
			return max(0, info.GetRetryDelay().AsDuration()), true
		}
	}
	return 0, false
}
