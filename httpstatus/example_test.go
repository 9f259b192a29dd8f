package httpstatus_test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/pgonce/pgonce/httpstatus"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleWrite answers a replayed outcome and one still in progress, as a
// gateway's handler does with what WaitResult returned.
func ExampleWrite() {
	key := outbox.Key("k1_aa36dcf33ebbd9faef757155d3dd9dce952e937ea84cef7f7359809820c3cdaa")
	for _, res := range []outbox.Result{
		{Key: key, State: outbox.StateSucceeded, Response: json.RawMessage(`{"refund_id": "re_1"}`)},
		{Key: key, State: outbox.StateInFlight, RetryAfter: 1500 * time.Millisecond},
	} {
		rec := httptest.NewRecorder()
		if err := httpstatus.Write(rec, res, nil); err != nil {
			panic(err)
		}
		fmt.Printf("%d Retry-After=%q Idempotent-Replayed=%q\n",
			rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get(httpstatus.ReplayedHeader))
		fmt.Println(rec.Body.String())
	}

	// Output:
	// 200 Retry-After="" Idempotent-Replayed="true"
	// {"status":"succeeded","key":"k1_aa36dcf33ebbd9faef757155d3dd9dce952e937ea84cef7f7359809820c3cdaa","replayed":true,"response":{"refund_id": "re_1"}}
	// 202 Retry-After="2" Idempotent-Replayed=""
	// {"status":"in_progress","key":"k1_aa36dcf33ebbd9faef757155d3dd9dce952e937ea84cef7f7359809820c3cdaa","retry_after_ms":1500,"message":"the action is in progress; ask again later with the same arguments, never with new ones"}
}

// ExampleFor maps an error to its status: the same step asked again with
// other arguments is a 409.
func ExampleFor() {
	err := &outbox.KeyConflictError{Key: "k1_d62e3a58cf27d5fc10cb8d09938b5ac1d8fe9a747adbd3ad331e7340ea92e3ea"}
	fmt.Println(httpstatus.For(outbox.Result{}, err).Code)
	fmt.Println(httpstatus.For(outbox.Result{}, outbox.ErrTimeout))

	// Output:
	// 409
	// {503 1s false}
}
