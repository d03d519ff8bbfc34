package workers

import "encoding/json"

// offsets are positions in a run's two outputs, stdout and stderr: in the task's
// log streams (where each stands), or in the run's output files (how far the log
// has taken each). run.json keeps them as the array [stdout, stderr].
type offsets struct{ stdout, stderr int64 }

func (o offsets) MarshalJSON() ([]byte, error) {
	return json.Marshal([2]int64{o.stdout, o.stderr})
}

func (o *offsets) UnmarshalJSON(data []byte) error {
	var both [2]int64
	if err := json.Unmarshal(data, &both); err != nil {
		return err
	}
	o.stdout, o.stderr = both[0], both[1]
	return nil
}
