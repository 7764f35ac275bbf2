package dashboards

import (
	"encoding/json"
	"strings"
	"testing"
)

// grafanaPanel is what Grafana reads of a panel.
type grafanaPanel struct {
	ID      int
	Type    string
	Title   string
	GridPos struct{ H, W, X, Y int }
	Targets []struct {
		Expr, LegendFormat, RefID string
		Datasource                struct{ UID string }
	}
}

func TestEveryDashboardRendersAsGrafanaLaysItOut(t *testing.T) {
	for _, d := range All() {
		b, err := d.JSON()
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			UID, Title string
			Panels     []grafanaPanel
			Templating struct{ List []struct{ Name, Type string } }
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%s: %v", d.UID, err)
		}
		if got.UID != d.UID || len(got.Templating.List) != 1 || got.Templating.List[0].Name != "datasource" {
			t.Fatalf("%s: uid %q, variables %v", d.UID, got.UID, got.Templating.List)
		}
		ids := map[int]bool{}
		cells := map[[2]int]string{} // each grid cell belongs to one panel
		for _, p := range got.Panels {
			if ids[p.ID] {
				t.Errorf("%s: panel id %d twice", d.UID, p.ID)
			}
			ids[p.ID] = true
			if p.GridPos.X+p.GridPos.W > gridWidth || p.GridPos.W == 0 || p.GridPos.H == 0 {
				t.Errorf("%s: panel %q at %+v is off the grid", d.UID, p.Title, p.GridPos)
			}
			for x := p.GridPos.X; x < p.GridPos.X+p.GridPos.W; x++ {
				for y := p.GridPos.Y; y < p.GridPos.Y+p.GridPos.H; y++ {
					if other, ok := cells[[2]int{x, y}]; ok {
						t.Fatalf("%s: panels %q and %q overlap at %d,%d", d.UID, other, p.Title, x, y)
					}
					cells[[2]int{x, y}] = p.Title
				}
			}
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", d.UID, p.Title)
			}
			refs := map[string]bool{}
			for _, q := range p.Targets {
				if q.Expr == "" || q.LegendFormat == "" || q.Datasource.UID != "${datasource}" || refs[q.RefID] {
					t.Errorf("%s: panel %q: target %+v", d.UID, p.Title, q)
				}
				refs[q.RefID] = true
			}
		}
	}
}

func TestADashboardWithoutAQueryOrAnIdentityIsRefused(t *testing.T) {
	for _, c := range []struct {
		d    Dashboard
		want string
	}{
		{Dashboard{Title: "t"}, "a UID and a title"},
		{Dashboard{UID: "u", Title: "t", Rows: []Row{{Title: "r", Panels: []Panel{{Title: "empty"}}}}}, `panel "empty": no query`},
	} {
		if _, err := c.d.JSON(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.d, err, c.want)
		}
	}
}

func TestRateWindowsAreGrafanasAndQuantilesKeepTheirGrouping(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{rate("x_total"), "rate(x_total[$__rate_interval])"},
		{quantile(0.99, "h", ""), "histogram_quantile(0.99, sum by (le) (rate(h_bucket[$__rate_interval])))"},
		{quantile(0.5, "h", "type"), "histogram_quantile(0.5, sum by (le, type) (rate(h_bucket[$__rate_interval])))"},
		{perService("up"), `up * on (job, instance) group_left (service_name) ` + services},
	} {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
}
