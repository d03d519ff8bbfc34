package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/bgtask/bgtask/client"
)

// A program registers work, and waits for its wake-up. The client finds the
// server through its home ($BGTASK_HOME here), as the bgtask command does. A spec
// with no command is a timer: it fires at its start.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Connect(ctx, client.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	reg, err := c.Register(ctx, client.Spec{StartAt: "100ms", Prompt: "Check the deploy.", Target: "example"})
	if err != nil {
		log.Fatal(err)
	}
	task, err := c.Wait(ctx, reg.ID)
	if err != nil {
		log.Fatal(err)
	}
	w := client.WakeupOf(task)
	fmt.Println(w.Status, "-", w.Prompt)
	// Output: succeeded - Check the deploy.
}

// A reader of a target's inbox gets each wake-up until it acknowledges it.
func ExampleInbox() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Connect(ctx, client.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	reg, err := c.Register(ctx, client.Spec{StartAt: "100ms", Prompt: "Tests are done.", Target: "example-inbox"})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Wait(ctx, reg.ID); err != nil {
		log.Fatal(err)
	}

	inbox, err := c.Inbox(ctx, "example-inbox")
	if err != nil {
		log.Fatal(err)
	}
	wakeups, err := inbox.Fetch(ctx, 10, time.Second)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range wakeups {
		fmt.Println(d.Wakeup.Prompt)
		if err := d.Ack(ctx); err != nil { // never delivered again
			log.Fatal(err)
		}
	}
	// Output: Tests are done.
}

// A runtime integration hands a target's wake-ups to its agent, each once: the
// hand-off records what it handed over before it acknowledges it.
func ExampleHandoff() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Connect(ctx, client.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	for _, prompt := range []string{"Build finished.", "Deploy finished."} {
		reg, err := c.Register(ctx, client.Spec{StartAt: "100ms", Prompt: prompt, Target: "example-agent"})
		if err != nil {
			log.Fatal(err)
		}
		if _, err := c.Wait(ctx, reg.ID); err != nil {
			log.Fatal(err)
		}
	}

	h := &client.Handoff{Target: "example-agent", Dir: c.Home() + "/handoff", Batch: 10,
		Deliver: func(ctx context.Context, batch []client.Wakeup) error {
			for _, w := range batch {
				fmt.Println("to the agent:", w.Prompt) // a runtime gives its session a turn here
			}
			return nil
		}}
	unlock, err := h.Lock(ctx, true)
	if err != nil {
		log.Fatal(err)
	}
	defer unlock()
	n, err := h.Pending(ctx, c)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(n, "handed over")
	// Output:
	// to the agent: Build finished.
	// to the agent: Deploy finished.
	// 2 handed over
}

// A reader follows a task's events as they are appended, each with its sequence
// in the event stream, after which a reader that lost its place resumes
// (EventOptions.After).
func ExampleClient_Events() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Connect(ctx, client.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	reg, err := c.Register(ctx, client.Spec{StartAt: "100ms", Prompt: "Look at the logs.", Target: "example-events"})
	if err != nil {
		log.Fatal(err)
	}

	feed, err := c.Events(ctx, client.EventOptions{Task: reg.ID})
	if err != nil {
		log.Fatal(err)
	}
	errFired := errors.New("fired")
	err = feed.Read(ctx, func(ev client.Event) error {
		fmt.Println(ev.Type)
		if ev.Type == "fired" {
			return errFired // enough
		}
		return nil
	})
	if !errors.Is(err, errFired) {
		log.Fatal(err)
	}
	// Output:
	// armed
	// due
	// completion-persisted
	// fired
}
