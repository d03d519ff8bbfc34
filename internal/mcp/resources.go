package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bgtask/bgtask/client"
)

// The tasks as resources: each one's view, listed as they are now.

const taskURIPrefix = "bgtask://tasks/"

// privateNow: a task is the user's, and may have changed by the next read.
var privateNow = mcp.Cacheable{CacheScope: "private"}

func (s *server) addResources(m *mcp.Server) {
	m.AddResourceTemplate(&mcp.ResourceTemplate{
		URITemplate: taskURIPrefix + "{id}",
		Name:        "task",
		Title:       "A bgtask task",
		Description: "A task's current view: its spec, state, run, exit code and wake-up (what show returns).",
		MIMEType:    "application/json",
	}, s.readTask)
	// The tasks are listed from the API as they are now, not from a set the server
	// was given.
	m.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if r, ok := req.(*mcp.ListResourcesRequest); ok && method == "resources/list" {
				return s.listResources(ctx, r)
			}
			return next(ctx, method, req)
		}
	})
}

func (s *server) readTask(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	t, err := s.task(ctx, strings.TrimPrefix(uri, taskURIPrefix))
	var apiErr *client.Error
	if errors.As(err, &apiErr) && apiErr.Code == 404 {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return nil, err
	}
	return &mcp.ReadResourceResult{
		Cacheable: privateNow,
		Contents:  []*mcp.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(data)}},
	}, nil
}

// listResources lists the tasks, newest first, a page of the API's at a time.
func (s *server) listResources(ctx context.Context, req *mcp.ListResourcesRequest) (*mcp.ListResourcesResult, error) {
	cursor := ""
	if req.Params != nil {
		cursor = req.Params.Cursor
	}
	var page client.ListPage
	err := s.call(ctx, func(ctx context.Context, c *client.Client) (err error) {
		page, err = c.ListPage(ctx, client.ListQuery{Limit: pageSize}, cursor)
		return err
	})
	if err != nil {
		return nil, err
	}
	res := &mcp.ListResourcesResult{Cacheable: privateNow, Resources: make([]*mcp.Resource, 0, len(page.Tasks)), NextCursor: page.NextCursor}
	for _, t := range page.Tasks {
		state := string(t.Phase)
		if t.Status != "" {
			state += ", " + t.Status
		}
		res.Resources = append(res.Resources, &mcp.Resource{
			URI:         taskURIPrefix + t.ID,
			Name:        t.ID,
			Title:       oneLine(t.Command, 80),
			Description: fmt.Sprintf("task %s (%s): %s", t.ID, state, oneLine(t.Command, 200)),
			MIMEType:    "application/json",
		})
	}
	return res, nil
}
