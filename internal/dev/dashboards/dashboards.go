// Package dashboards defines Flotilla's Grafana dashboards: the panels, the
// PromQL each reads and how it is shown. JSON renders a dashboard in
// Grafana's model (schemaVersion 39, one "datasource" variable), which
// `make generate` writes into deploy/helm/flotilla/dashboards for the chart
// to ship as a ConfigMap and for users to import.
//
// The queries read the metrics docs/metrics.md lists: Istio's names where
// a Flotilla service does what an Istio component does, so the same panels
// read an istiod; Flotilla's own for the rest. They select no scrape job
// or pod label, which differ between Prometheus set-ups (pod annotations, a
// ServiceMonitor, static targets): a per-replica panel groups by instance,
// and a panel about every service joins on target_info, whose service_name
// each service exports about itself.
package dashboards

import (
	"encoding/json"
	"fmt"
)

// Dashboard is one Grafana dashboard.
type Dashboard struct {
	// UID is Grafana's stable identifier and the file's name.
	UID         string
	Title       string
	Description string
	Rows        []Row
}

// Row is a titled group of panels, laid out three to a line.
type Row struct {
	Title  string
	Panels []Panel
}

// Panel is one graph or figure.
type Panel struct {
	Title       string
	Description string
	// Unit is Grafana's unit id: "s", "bytes", "short", "reqps", "percentunit".
	Unit string
	// Stat shows the latest values as figures instead of a time series.
	Stat    bool
	Queries []Query
}

// Query is one PromQL expression and how its series are named in the
// legend. Expressions may use Grafana's $__rate_interval.
type Query struct {
	Expr   string
	Legend string
}

// RateInterval is the Grafana variable rate windows are written with.
const RateInterval = "$__rate_interval"

// The panel grid: Grafana's 24 columns, three panels to a line.
const (
	gridWidth   = 24
	panelWidth  = 8
	panelHeight = 8
)

// JSON renders d in Grafana's dashboard model, indented, with a trailing
// newline.
func (d Dashboard) JSON() ([]byte, error) {
	if d.UID == "" || d.Title == "" {
		return nil, fmt.Errorf("dashboard %q: a UID and a title are needed", d.Title)
	}
	datasource := map[string]any{"type": "prometheus", "uid": "${datasource}"}
	var panels []any
	id, y := 0, 0
	for _, r := range d.Rows {
		id++
		panels = append(panels, map[string]any{
			"type": "row", "id": id, "title": r.Title, "collapsed": false, "panels": []any{},
			"gridPos": map[string]int{"h": 1, "w": gridWidth, "x": 0, "y": y},
		})
		y++
		for i, p := range r.Panels {
			if len(p.Queries) == 0 {
				return nil, fmt.Errorf("dashboard %s, panel %q: no query", d.UID, p.Title)
			}
			id++
			targets := make([]any, 0, len(p.Queries))
			for j, q := range p.Queries {
				targets = append(targets, map[string]any{
					"datasource": datasource, "expr": q.Expr, "legendFormat": q.Legend,
					"refId": string(rune('A' + j)), "range": true,
				})
			}
			kind, options := "timeseries", map[string]any{
				"legend":  map[string]any{"displayMode": "list", "placement": "bottom", "showLegend": true},
				"tooltip": map[string]any{"mode": "multi", "sort": "desc"},
			}
			if p.Stat {
				kind, options = "stat", map[string]any{
					"reduceOptions": map[string]any{"calcs": []string{"lastNotNull"}, "fields": "", "values": false},
					"textMode":      "value_and_name", "colorMode": "none", "graphMode": "none",
				}
			}
			panels = append(panels, map[string]any{
				"type": kind, "id": id, "title": p.Title, "description": p.Description,
				"datasource": datasource, "targets": targets, "options": options,
				"fieldConfig": map[string]any{"defaults": map[string]any{"unit": p.Unit}, "overrides": []any{}},
				"gridPos":     map[string]int{"h": panelHeight, "w": panelWidth, "x": i % 3 * panelWidth, "y": y + i/3*panelHeight},
			})
		}
		y += (len(r.Panels) + 2) / 3 * panelHeight
	}
	out, err := json.MarshalIndent(map[string]any{
		"uid": d.UID, "title": d.Title, "description": d.Description,
		"tags":          []string{"flotilla", "istio", "control-plane"},
		"schemaVersion": 39, "version": 1, "editable": true, "graphTooltip": 1,
		"refresh": "30s", "time": map[string]string{"from": "now-1h", "to": "now"}, "timezone": "browser",
		"annotations": map[string]any{"list": []any{}},
		"templating": map[string]any{"list": []any{map[string]any{
			"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
			"current": map[string]any{}, "hide": 0, "refresh": 1,
		}}},
		"panels": panels,
	}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("dashboard %s: %w", d.UID, err)
	}
	return append(out, '\n'), nil
}
