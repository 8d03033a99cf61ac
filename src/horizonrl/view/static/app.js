"use strict";
/* The viewer's hash router and its two small pages: #/ (the runs) and #/run/ID/compare?task= (one
   eval task before and after training). The run page is in run.js, the trajectory page in
   trajectory.js. */

(function () {
  const el = V.el;

  function crumbs(...parts) {
    V.fill(document.getElementById("crumbs"), parts.flatMap((p) => [" / ", p]));
  }

  function backToRun(run) {
    return el("a", { href: sessionStorage.getItem(`back:${run}`) || V.runHref(run) }, run);
  }

  function runRow(r) {
    const bad = r.parse_errors ? el("div", { class: "bad-text small" }, `${r.parse_errors} unparsed`) : null;
    return el(
      "tr",
      { testid: "run-row" },
      el(
        "td",
        {},
        el("a", { href: V.runHref(r.id), testid: "run-link" }, r.name),
        el("div", { class: "muted small" }, r.path)
      ),
      el("td", {}, r.env || "–"),
      el("td", { class: "small" }, r.model || "–"),
      el("td", {}, V.statusBadge(r.status)),
      el("td", { class: "num" }, V.num(r.steps)),
      el("td", { class: "num" }, V.pct(r.success), el("div", { class: "muted small" }, r.success_from)),
      el("td", { class: "num", testid: "run-count" }, V.num(r.trajectories), bad),
      el("td", { class: "small" }, V.ago(r.updated))
    );
  }

  function runsTable(runs) {
    const head = ["run", "env", "model", "status", "steps", "success", "trajectories", "updated"];
    return el(
      "table",
      { class: "grid", testid: "runs-table" },
      el("thead", {}, el("tr", {}, head.map((h) => el("th", {}, h)))),
      el("tbody", {}, runs.map(runRow))
    );
  }

  function emptyState(paths) {
    return el(
      "div",
      { class: "empty", testid: "empty-state" },
      el("h2", {}, "Nothing is written yet"),
      el(
        "p",
        {},
        `No run under ${paths.join(", ")} has written anything yet. Start one (for example `,
        el("code", {}, "horizon train configs/calc.yaml"),
        ") and it shows up here: this page looks again every 3 s."
      )
    );
  }

  function runsPage(main) {
    crumbs();
    const body = el("div", { testid: "runs" }, el("div", { class: "muted" }, "loading…"));
    main.append(el("section", { class: "page" }, el("h1", {}, "Runs"), body));
    let paths = null;
    return V.poll(async () => {
      const runs = await V.api("api/runs");
      if (paths === null) paths = (await V.api("api/info")).paths;
      V.fill(body, runs.length ? runsTable(runs) : emptyState(paths));
    }, V.POLL_MS);
  }

  function comparePage(main, run, params) {
    const task = params.get("task");
    crumbs(backToRun(run), `compare ${task}`);
    const loading = el("div", { class: "muted" }, "loading…");
    const page = el("section", { class: "page", testid: "compare-page" }, loading);
    main.append(page);
    const side = (label, part) => {
      const where = `${part.file} line ${part.index + 1}`;
      const body = part.parse_error
        ? V.unparsed(part)
        : [el("section", { class: "card" }, V.trajectoryHeader(part)), V.renderMessages(part.record, null)];
      return el(
        "div",
        { class: "compare-col", testid: `compare-${label}` },
        el("h2", {}, label, " · ", el("a", { href: V.trajHref(run, part.file, part.index) }, where)),
        body
      );
    };
    V.api(`${V.runApi(run, "compare")}?${V.query({ task_id: task })}`)
      .then((data) =>
        V.fill(
          page,
          el("h1", {}, `Task ${task}: before and after training`),
          el("div", { class: "compare-grid" }, side("before", data.before), side("after", data.after))
        )
      )
      .catch((e) => V.fill(page, V.errorBox(e.message)));
    return { stop() {} };
  }

  let current = null;

  function route() {
    if (current) current.stop();
    current = null;
    const hash = location.hash.replace(/^#/, "") || "/";
    const [path, query] = hash.split("?");
    const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    const params = new URLSearchParams(query || "");
    const main = V.fill(document.getElementById("main"));
    window.scrollTo(0, 0);
    const run = parts[1];
    if (parts.length === 0) current = runsPage(main);
    else if (parts[0] === "run" && parts.length === 2) {
      crumbs(el("a", { href: V.runHref(run) }, run));
      current = V.runPage(main, run, params);
    } else if (parts[0] === "run" && parts[2] === "trajectory") {
      crumbs(backToRun(run), "trajectory");
      current = V.trajectoryPage(main, run, params);
    } else if (parts[0] === "run" && parts[2] === "compare") current = comparePage(main, run, params);
    else main.append(V.errorBox(`no page ${hash}`));
  }

  window.addEventListener("hashchange", route);
  route();
})();
