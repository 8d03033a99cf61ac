"use strict";
/* One run: its facts, metric charts, and two tabs: the trajectory table (filters, 50 a page) and
   the eval tasks before and after training. Polls every 3 s, so a run being written updates live;
   filters and the page live in the URL, so the back button returns to them. */

(function () {
  const el = V.el;
  const PAGE = 50;
  const FILTERS = ["file", "finish", "env", "role", "step", "min_reward", "max_reward", "success", "q"];
  const CHARTS = [
    ["Reward", ["reward_mean"]],
    ["Success (training)", ["success_rate"]],
    ["Eval success", ["eval/success", "eval/base_success"]],
    ["Loss", ["loss", "pg_loss"]],
    ["KL", ["approx_kl", "kl", "sampler_kl"]],
    ["Entropy", ["entropy"]],
    ["Step time (s)", ["rollout_s", "update_s", "eval_s"]],
    ["Wall time (s)", ["wall_s"]],
  ];

  V.statusBadge = function (status) {
    const kind = { running: "live-badge", finished: "ok", stopped: "warn", empty: "" }[status] || "";
    return V.badge(status, kind, "run-status");
  };

  function runFacts(info) {
    const text = [
      info.env || "–",
      info.model || "no model named",
      `${V.num(info.steps)} steps`,
      `success ${V.pct(info.success)} (${info.success_from || "–"})`,
      `${V.num(info.trajectories)} trajectories`,
      `updated ${V.ago(info.updated)}`,
    ].join(" · ");
    return el(
      "div",
      { class: "run-facts", testid: "run-facts" },
      V.statusBadge(info.status),
      ` ${text} · `,
      el("span", { class: "muted" }, info.path)
    );
  }

  /* The 95% interval of series k, from its k_low and k_high series: [[step, low, high], ...]. */
  function band(series, k) {
    const high = new Map((series[`${k}_high`] || []).filter((p) => p[1] !== null));
    const low = (series[`${k}_low`] || []).filter((p) => p[1] !== null && high.has(p[0]));
    return low.map(([x, lo]) => [x, lo, high.get(x)]);
  }

  function charts(series, extra) {
    const grid = el("div", { class: "charts", testid: "charts" });
    const chart = (title, keys) =>
      V.lineChart(title, keys.map((k) => ({ name: k, points: series[k], band: band(series, k) })), "chart");
    for (const [title, keys] of CHARTS) {
      const present = keys.filter((k) => series[k]);
      if (present.length) grid.append(chart(title, present));
    }
    if (extra && series[extra]) grid.append(chart(extra, [extra]));
    return grid;
  }

  function metricPicker(keys, chosen, onchange) {
    return el(
      "select",
      { testid: "metric-picker", onchange: (e) => onchange(e.target.value) },
      el("option", { value: "" }, "chart another metric…"),
      keys.map((k) => el("option", { value: k, selected: k === chosen }, k))
    );
  }

  function select(name, label, options, value, onchange) {
    const option = ([v, text]) => el("option", { value: v, selected: String(v) === value }, text);
    const any = el("option", { value: "" }, `${label}: any`);
    return el("label", {}, el("select", { name, testid: `filter-${name}`, onchange }, any, options.map(option)));
  }

  function trajectoryRow(run, s, columns) {
    const href = V.trajHref(run, s.file, s.index);
    const where = el(
      "td",
      { class: "small nowrap", title: s.file },
      V.stepText(s.step) || s.file,
      el("span", { class: "muted" }, ` · line ${s.index + 1}`)
    );
    if (s.parse_error) {
      const what = el(
        "td",
        { colspan: columns - 1 },
        el("a", { href, testid: "traj-link" }, s.id || "unparsed line"),
        " ",
        V.badge("unparsed", "bad", "unparsed"),
        el("div", { class: "bad-text small" }, s.parse_error)
      );
      return el("tr", { class: "bad-row", testid: "traj-row" }, where, what);
    }
    return el(
      "tr",
      { testid: "traj-row" },
      where,
      el("td", {}, el("a", { href, testid: "traj-link" }, s.id)),
      el("td", { class: "small" }, s.task_id),
      el("td", {}, s.env),
      columns === 9 ? el("td", {}, s.role || "–") : null,
      el("td", {}, V.finishBadge(s.finish)),
      el("td", { class: "num" }, V.num(s.reward, 3)),
      el("td", { class: "num" }, V.num(s.num_turns)),
      el("td", {}, V.successBadge(s.success))
    );
  }

  function trajectoryTable(run, data) {
    const roles = data.items.some((s) => s.role);
    const head = ["step", "id", "task", "env", roles ? "role" : null, "finish", "reward", "turns", "success"];
    const shown = head.filter(Boolean);
    return el(
      "table",
      { class: "grid", testid: "traj-table" },
      el("thead", {}, el("tr", {}, shown.map((h) => el("th", {}, h)))),
      el("tbody", {}, data.items.map((s) => trajectoryRow(run, s, shown.length)))
    );
  }

  function compareTab(run, data) {
    if (!data.before) {
      const why =
        "No before/after to compare: the run needs eval/base.jsonl (or start.jsonl, or an earlier eval " +
        "file) and an eval/step_*.jsonl.";
      return el("div", { class: "empty", testid: "compare-empty" }, why);
    }
    const t = data.totals;
    const change = (row) =>
      row.change === "same"
        ? el("span", { class: "muted" }, "same")
        : V.badge(row.change, row.change === "fixed" ? "ok" : "bad");
    const rows = data.tasks.map((row) =>
      el(
        "tr",
        { testid: "compare-row" },
        el("td", {}, el("a", { href: V.compareHref(run, row.task_id), testid: "compare-link" }, row.task_id)),
        el("td", { class: "num" }, V.num(row.before.reward, 3), " ", V.successBadge(row.before.success)),
        el("td", { class: "num" }, V.num(row.after.reward, 3), " ", V.successBadge(row.after.success)),
        el("td", {}, change(row))
      )
    );
    const summary =
      `${data.before} → ${data.after}: success ${V.pct(t.before_success)} → ${V.pct(t.after_success)} ` +
      `on ${t.tasks} tasks in both (${t.fixed} fixed, ${t.broke} broke)`;
    return el(
      "div",
      { testid: "compare-tab" },
      el("p", {}, summary),
      el(
        "table",
        { class: "grid", testid: "compare-table" },
        el("thead", {}, el("tr", {}, ["task", "before", "after", "change"].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows)
      )
    );
  }

  V.runPage = function (main, run, params) {
    const filters = Object.fromEntries(FILTERS.map((k) => [k, params.get(k) || ""]));
    let offset = Number(params.get("offset")) || 0;
    let tab = params.get("tab") || "trajectories";
    let extra = params.get("metric") || "";
    const title = el("h1", {}, run);
    const [facts, chartBox, tabs, tabBody, table, compareBox] = [0, 0, 0, 0, 0, 0].map(() => el("div", {}));
    const filterBar = el("div", { class: "filters", testid: "filters" });
    const pager = el("div", { class: "pager" });
    main.append(el("section", { class: "page", testid: "run-page" }, title, facts, chartBox, tabs, tabBody));

    let seq = 0; // a response to an older request (a poll racing a filter change) is dropped
    let lastSeries = "";
    let lastFilters = "";
    let typing = null;

    const saveHash = () => {
      const state = { ...filters, offset: offset || "", tab: tab === "trajectories" ? "" : tab, metric: extra };
      const hash = V.runHref(run, state);
      history.replaceState(null, "", hash);
      sessionStorage.setItem(`back:${run}`, hash);
    };
    const change = (apply) => {
      apply();
      saveHash();
      refresh().catch((e) => V.fill(facts, V.errorBox(e.message)));
    };
    const setFilter = (name, value) =>
      change(() => {
        filters[name] = value;
        offset = 0;
      });

    function buildFilters(data) {
      const onSelect = (e) => setFilter(e.target.name, e.target.value);
      const fileLabel = (f) => `${f.step !== null ? V.stepText(f.step) : f.file} (${f.lines})`;
      const files = data.files.map((f) => [f.file, fileLabel(f)]);
      const opts = (values) => values.map((v) => [v, v]);
      const input = (name, placeholder, type) =>
        el("input", {
          name,
          type: type || "text",
          placeholder,
          value: filters[name],
          testid: `filter-${name}`,
          step: type === "number" ? "any" : null,
          oninput: (e) => {
            clearTimeout(typing);
            typing = setTimeout(() => setFilter(name, e.target.value), 300);
          },
        });
      const clear = () =>
        change(() => {
          FILTERS.forEach((k) => (filters[k] = ""));
          offset = 0;
          lastFilters = "";
        });
      V.fill(
        filterBar,
        select("file", "file", files, filters.file, onSelect),
        select("finish", "finish", opts(data.facets.finish), filters.finish, onSelect),
        data.facets.env.length > 1 ? select("env", "env", opts(data.facets.env), filters.env, onSelect) : null,
        data.facets.role.length ? select("role", "role", opts(data.facets.role), filters.role, onSelect) : null,
        select("success", "success", [["true", "success"], ["false", "fail"]], filters.success, onSelect),
        input("min_reward", "reward ≥", "number"),
        input("max_reward", "reward ≤", "number"),
        input("q", "search id / task"),
        el("button", { testid: "filter-clear", onclick: clear }, "clear")
      );
    }

    function showTrajectories(data) {
      const key = JSON.stringify([data.files, data.facets, filters]);
      if (key !== lastFilters && !filterBar.contains(document.activeElement)) {
        buildFilters(data);
        lastFilters = key;
      }
      const none = data.all ? "No trajectory matches these filters." : "No trajectory is written yet.";
      const rows = data.items.length ? trajectoryTable(run, data) : null;
      V.fill(table, rows || el("div", { class: "empty", testid: "no-rows" }, none));
      const first = data.total ? offset + 1 : 0;
      const last = Math.min(offset + PAGE, data.total);
      const go = (to) => () => change(() => (offset = to));
      V.fill(
        pager,
        el("button", { testid: "prev", disabled: !offset, onclick: go(Math.max(0, offset - PAGE)) }, "‹ prev"),
        el("span", { testid: "pager-count" }, `${first}–${last} of ${data.total}`),
        data.total !== data.all ? el("span", { class: "muted" }, ` (filtered from ${data.all})`) : null,
        el("button", { testid: "next", disabled: last >= data.total, onclick: go(offset + PAGE) }, "next ›")
      );
    }

    function showMetrics(metrics) {
      const key = JSON.stringify([metrics.rows, metrics.bad_lines, extra]);
      if (key === lastSeries) return;
      lastSeries = key;
      if (!metrics.rows) {
        V.fill(chartBox, el("div", { class: "muted", testid: "no-metrics" }, "No metrics.jsonl lines yet."));
        return;
      }
      const pick = (value) =>
        change(() => {
          extra = value;
          lastSeries = "";
        });
      V.fill(
        chartBox,
        charts(metrics.series, extra),
        metricPicker(Object.keys(metrics.series).sort(), extra, pick),
        metrics.bad_lines
          ? el("div", { class: "bad-text small" }, `${metrics.bad_lines} metrics lines do not parse`)
          : null
      );
    }

    function showTabs() {
      const tabButton = (name, text) => {
        const onclick = () => {
          change(() => (tab = name));
          showTabs();
        };
        const cls = tab === name ? "tab active" : "tab";
        return el("button", { class: cls, testid: `tab-${name}`, onclick }, text);
      };
      V.fill(tabs, tabButton("trajectories", "Trajectories"), tabButton("compare", "Compare before/after"));
      V.fill(tabBody, tab === "trajectories" ? [filterBar, table, pager] : compareBox);
    }

    async function refresh() {
      const mine = ++seq;
      const query = V.query({ ...filters, offset, limit: PAGE });
      const listing = tab === "trajectories" ? `trajectories?${query}` : "compare";
      let info, metrics, data;
      try {
        [info, metrics, data] = await Promise.all([
          V.api(V.runInfoApi(run)),
          V.api(V.runApi(run, "metrics")),
          V.api(V.runApi(run, listing)),
        ]);
      } catch (e) {
        if (e.status === 404 && mine === seq) V.fill(facts, V.errorBox(e.message));
        throw e;
      }
      if (mine !== seq) return;
      title.textContent = info.name;
      V.fill(facts, runFacts(info));
      showMetrics(metrics);
      if (tab === "trajectories") showTrajectories(data);
      else V.fill(compareBox, compareTab(run, data));
    }

    saveHash();
    showTabs();
    return V.poll(refresh, V.POLL_MS);
  };
})();
