package workers

import (
	"encoding/json"
	"strings"
	"testing"
)

// run.json keeps where the log stood as [stdout, stderr]: a worker reads the files
// of runs its previous process started.
func TestRunJSONKeepsTheLogOffsetsAsAnArray(t *testing.T) {
	data, err := json.Marshal(shimRun{TaskID: "t", Epoch: 1, LogOffsets: offsets{stdout: 3, stderr: 5}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"log_offsets":[3,5]`) {
		t.Fatalf("run.json is %s, want log_offsets [3,5]", data)
	}
	var back shimRun
	if err := json.Unmarshal([]byte(`{"task_id":"t","epoch":1,"log_offsets":[7,11]}`), &back); err != nil {
		t.Fatal(err)
	}
	if back.LogOffsets != (offsets{stdout: 7, stderr: 11}) {
		t.Fatalf("read log_offsets [7,11] as %+v", back.LogOffsets)
	}
}
