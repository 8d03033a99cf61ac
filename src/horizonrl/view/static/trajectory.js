"use strict";
/* One trajectory: its header, messages by role (tool calls, observations, diffs), per-turn reward and
   attribution, MAST modes, the token view, feedback buttons, and an episode's roles side by side. */

(function () {
  const el = V.el;
  const DIFF_START = /^(diff --git |@@ |--- a\/)/m;
  const DIFF_META = ["+++", "---", "diff --git", "index "];

  /* Text, with the lines of any unified diff in it coloured (prose before the diff stays plain). */
  function textBlock(text, cls) {
    const pre = el("pre", { class: cls || "content" });
    const match = DIFF_START.exec(text || "");
    if (!match) {
      pre.textContent = text || "";
      return pre;
    }
    pre.classList.add("has-diff");
    pre.append(text.slice(0, match.index), diffLines(text.slice(match.index).split("\n")));
    return pre;
  }

  function diffLines(lines) {
    const box = el("span", { class: "diff", testid: "diff" });
    for (const line of lines) {
      let kind = "ctx";
      if (DIFF_META.some((prefix) => line.startsWith(prefix))) kind = "meta";
      else if (line.startsWith("@@")) kind = "hunk";
      else if (line.startsWith("+")) kind = "add";
      else if (line.startsWith("-")) kind = "del";
      box.append(el("span", { class: `dl ${kind}` }, line + "\n"));
    }
    return box;
  }

  /* A str_replace_editor-style edit (old_str -> new_str) as a red/green diff. */
  function editDiff(args) {
    const lines = [];
    if (typeof args.old_str === "string") lines.push(...args.old_str.split("\n").map((l) => "-" + l));
    if (typeof args.new_str === "string") lines.push(...args.new_str.split("\n").map((l) => "+" + l));
    return el("pre", { class: "content has-diff" }, diffLines(lines));
  }

  /* A tool call: its name, its arguments as JSON, and an edit's old/new text as a diff. */
  function toolCall(call) {
    const fn = call.function || call;
    let args = fn.arguments;
    if (typeof args === "string") {
      try {
        args = JSON.parse(args);
      } catch (e) {
        /* shown as written */
      }
    }
    const isEdit = args && typeof args === "object" && ("old_str" in args || "new_str" in args);
    const rest = isEdit
      ? Object.fromEntries(Object.entries(args).filter(([k]) => k !== "old_str" && k !== "new_str"))
      : args;
    const head = el(
      "div",
      { class: "call-head" },
      "call ",
      el("b", { testid: "tool-name" }, fn.name || "?"),
      call.id ? el("span", { class: "muted" }, ` ${call.id}`) : null
    );
    const shown = typeof rest === "string" ? rest : JSON.stringify(rest, null, 2);
    return el(
      "div",
      { class: "tool-call", testid: "tool-call" },
      head,
      textBlock(shown, "args"),
      isEdit ? editDiff(args) : null
    );
  }

  function labelBadge(label) {
    return V.badge(label, label === "GOOD" ? "ok" : label === "BAD" ? "bad" : "", "attribution");
  }

  /* Messages by role; assistant turn i gets turn_rewards[i] and attribution label i. */
  V.renderMessages = function (record, attribution) {
    const list = el("div", { class: "messages", testid: "messages" });
    const rewards = record.turn_rewards || [];
    const labels = (attribution && attribution.labels) || [];
    let turn = 0;
    for (const msg of record.messages || []) {
      const role = msg.role || "?";
      const head = el("div", { class: "msg-head" }, el("span", { class: "role" }, role));
      if (role === "tool" && msg.name) head.append(el("span", { class: "muted" }, ` ${msg.name}`));
      if (role === "assistant") {
        head.append(el("span", { class: "muted" }, ` turn ${turn + 1}`));
        if (turn < rewards.length) {
          const reward = `reward ${V.num(rewards[turn])}`;
          head.append(el("span", { class: "turn-reward", testid: "turn-reward" }, reward));
        }
        if (turn < labels.length) head.append(labelBadge(labels[turn]));
        turn += 1;
      }
      const box = el("div", { class: `msg ${role}`, testid: `msg-${role}` }, head);
      if (msg.content) box.append(textBlock(msg.content));
      for (const call of msg.tool_calls || []) box.append(toolCall(call));
      list.append(box);
    }
    return list;
  };

  /* Shade of a trained-on token: lighter for likelier tokens, darker for unlikely ones. */
  function shade(p) {
    const light = Math.round(92 - 62 * (1 - p));
    return `background:hsl(212,85%,${light}%);color:${light < 55 ? "#fff" : "#0f172a"}`;
  }

  function tokenSpan(t) {
    let text = t.text === null ? `⟨${t.id}⟩` : t.text === "" ? "∅" : t.text;
    text = V.escape(text.replace(/\n/g, "↵\n").replace(/\t/g, "→\t"));
    if (t.mask !== 1) return `<span class="tok m0" title="id ${t.id} · prompt/env token (mask 0)">${text}</span>`;
    const p = t.logprob === null ? 1 : Math.exp(t.logprob);
    const lp = t.logprob === null ? "none" : t.logprob.toFixed(4);
    const title = `id ${t.id} · logprob ${lp} · p ${p.toFixed(3)}`;
    return `<span class="tok m1" data-p="${p}" title="${title}">${text}</span>`;
  }

  /* Every token as a span: trained-on tokens (loss mask 1) shaded by probability. */
  function tokenView(tokens, tokenizer) {
    const trained = tokens.filter((t) => t.mask === 1);
    const sum = trained.reduce((a, t) => a + (t.logprob || 0), 0);
    const mean = trained.length ? ` · mean logprob ${(sum / trained.length).toFixed(3)}` : "";
    const body = el("div", { class: "tokens", testid: "tokens" });
    body.innerHTML = tokens.map(tokenSpan).join("");
    // shaded through CSSOM: the page's Content-Security-Policy refuses style attributes in markup
    for (const span of body.querySelectorAll("[data-p]")) span.style.cssText = shade(Number(span.dataset.p));
    const jump = () => {
      const first = body.querySelector(".m1");
      if (first) body.scrollTop = first.offsetTop - body.offsetTop - 24;
    };
    const legend = el(
      "div",
      { class: "token-legend", testid: "token-legend" },
      el("span", { class: "tok m0" }, "prompt / env"),
      " mask 0 · trained-on (mask 1) by probability: ",
      [1, 0.7, 0.4, 0.1].map((p) => el("span", { class: "tok m1", style: shade(p) }, `p ${p}`)),
      " · hover a token for its id and logprob"
    );
    const count = `${tokens.length} tokens · ${trained.length} trained-on${mean}`;
    return el(
      "section",
      { class: "card", testid: "token-view" },
      el("h2", {}, "Tokens"),
      el(
        "div",
        { class: "token-count-row" },
        el("span", { class: "muted", testid: "token-count" }, count),
        trained.length ? el("button", { testid: "jump-response", onclick: jump }, "first trained token ↓") : null
      ),
      tokenizer && tokenizer.note ? el("div", { class: "note", testid: "tokenizer-note" }, tokenizer.note) : null,
      legend,
      body
    );
  }

  function keyValues(obj, testid) {
    const entries = Object.entries(obj || {});
    if (!entries.length) return el("span", { class: "muted" }, "–");
    const pair = ([k, v]) =>
      el("span", { class: "pair" }, `${k} `, el("b", {}, typeof v === "number" ? V.num(v, 4) : String(v)));
    return el("span", { class: "kv", testid }, entries.map(pair));
  }

  /* The facts of one trajectory: id, task, env, finish, reward, turns, file, metrics, timings. */
  V.trajectoryHeader = function (data) {
    const s = data.summary;
    const r = data.record || {};
    const step = s.step !== null ? ` · ${V.stepText(s.step)}` : "";
    const reward = [el("b", { testid: "traj-reward" }, V.num(s.reward, 4)), " ", V.successBadge(s.success)];
    const rows = [
      ["id", [el("code", { testid: "traj-id" }, s.id || "–")]],
      ["task", [s.task_id || "–"]],
      ["env", [s.env || "–"]],
      ["finish", [V.finishBadge(s.finish)]],
      s.role ? ["role", [s.role]] : null,
      s.episode_id ? ["episode", [s.episode_id]] : null,
      ["reward", reward],
      ["turns", [V.num(s.num_turns)]],
      ["turn rewards", [(r.turn_rewards || []).map((x) => V.num(x, 3)).join(", ") || "–"], true],
      ["file", [`${data.file} · line ${data.index + 1}${step}`], true],
      r.error ? ["error", [el("span", { class: "bad-text" }, r.error)], true] : null,
      ["metrics", [keyValues(r.metrics, "traj-metrics")], true],
      ["timings", [keyValues(r.timings)], true],
    ].filter(Boolean);
    const cells = rows.map(([k, v, wide]) => {
      const cls = wide ? "wide" : null;
      return [el("dt", { class: cls }, k), el("dd", { class: cls }, ...v)];
    });
    return el("dl", { class: "facts", testid: "traj-header" }, cells);
  };

  /* Thumbs up / down: POSTs feedback and says where it went (or why not). */
  function feedbackBox(run, data) {
    const word = (label) => (label === "up" ? "thumbs up" : "thumbs down");
    const before = data.feedback ? `rated ${word(data.feedback)} before` : "";
    const status = el("span", { class: "muted", testid: "fb-status" }, before);
    const send = async (label) => {
      status.textContent = "saving…";
      status.className = "muted";
      try {
        const res = await V.api(V.runApi(run, "feedback"), {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ trajectory_id: data.summary.id, label }),
        });
        status.textContent = `saved ${word(label)} to ${res.file}`;
        status.className = "ok-text";
      } catch (e) {
        status.textContent = e.message;
        status.className = "bad-text";
      }
    };
    const button = (label, text) =>
      el(
        "button",
        { testid: `fb-${label}`, onclick: () => send(label), disabled: !data.summary.id },
        text
      );
    return el(
      "div",
      { class: "feedback", testid: "feedback", title: "appends a line to the run's feedback.jsonl" },
      button("up", "▲ up"),
      button("down", "▼ down"),
      status
    );
  }

  function mastBox(entry, names) {
    const modes = Object.entries(entry.modes || {});
    const item = ([code, mode]) =>
      el(
        "li",
        { testid: "mast-mode", title: (names[code] || {}).definition || "" },
        V.badge(code, "bad"),
        " ",
        el("b", {}, (names[code] || {}).name || ""),
        el("div", { class: "muted" }, (mode.reasons || []).join(" · "))
      );
    return el(
      "section",
      { class: "card", testid: "mast" },
      el("h2", {}, "MAST failure modes"),
      modes.length ? el("ul", {}, modes.map(item)) : el("div", { class: "muted" }, "no failure mode found")
    );
  }

  /* The roles of a multi-agent episode, one column each; the open one outlined. */
  function episodeColumns(run, members) {
    const column = (m) =>
      el(
        "div",
        { class: `episode-col${m.current ? " current" : ""}`, testid: "episode-col" },
        el(
          "h3",
          {},
          m.summary.role || "?",
          " ",
          el("a", { href: V.trajHref(run, m.summary.file, m.summary.index) }, m.summary.id || "line")
        ),
        el("div", {}, V.finishBadge(m.summary.finish), " reward ", V.num(m.summary.reward, 3)),
        m.record && !m.parse_error ? V.renderMessages(m.record, null) : V.errorBox(m.parse_error)
      );
    const title = `Episode ${members[0].summary.episode_id} · roles side by side`;
    return el(
      "section",
      { class: "card", testid: "episode" },
      el("h2", {}, title),
      el("div", { class: "episode-grid" }, members.map(column))
    );
  }

  /* What a line that does not parse shows: its error and its text. */
  V.unparsed = function (data) {
    const text = data.raw !== undefined ? data.raw : JSON.stringify(data.record, null, 2);
    return el(
      "section",
      { class: "card bad-card", testid: "parse-error" },
      el("h2", {}, "This line does not parse as a trajectory"),
      el("div", { class: "bad-text", testid: "parse-error-message" }, data.parse_error),
      el("pre", { class: "raw", testid: "raw-line" }, text),
      data.raw_truncated ? el("div", { class: "muted" }, "(cut at 100,000 characters)") : null
    );
  };

  function lineNav(run, file, data) {
    const back = sessionStorage.getItem(`back:${run}`) || V.runHref(run);
    return el(
      "div",
      { class: "nav" },
      el("a", { href: back, testid: "back" }, "← run"),
      data.prev !== null
        ? el("a", { href: V.trajHref(run, file, data.prev), testid: "prev-line" }, "‹ previous line")
        : null,
      data.next !== null
        ? el("a", { href: V.trajHref(run, file, data.next), testid: "next-line" }, "next line ›")
        : null
    );
  }

  V.trajectoryPage = function (main, run, params) {
    const file = params.get("file");
    const index = Number(params.get("index"));
    const loading = el("div", { class: "muted" }, "loading…");
    const page = el("section", { class: "page", testid: "trajectory-page" }, loading);
    main.append(page);
    V.api(`${V.runApi(run, "trajectory")}?${V.query({ file, index })}`)
      .then((data) => {
        V.fill(page, lineNav(run, file, data), el("h1", {}, data.summary.id || `${file} line ${index + 1}`));
        if (data.parse_error) {
          page.append(V.unparsed(data));
          return;
        }
        const mast = data.mast ? mastBox(data.mast, data.mast_modes || {}) : null;
        const side = el("div", { class: "side" }, feedbackBox(run, data), mast);
        const head = el("section", { class: "card" }, V.trajectoryHeader(data));
        page.append(el("div", { class: "head-grid" }, head, side));
        if (data.episode && data.episode.length > 1) page.append(episodeColumns(run, data.episode));
        const attr = data.attribution;
        const source = attr ? el("span", { class: "muted" }, ` · attribution from attribution/${attr.file}`) : null;
        const messages = el(
          "section",
          { class: "card" },
          el("h2", {}, "Messages", source),
          V.renderMessages(data.record, attr)
        );
        page.append(el("div", { class: "body-grid" }, messages, tokenView(data.tokens, data.tokenizer)));
      })
      .catch((e) => V.fill(page, V.errorBox(e.message)));
    return { stop() {} };
  };
})();
