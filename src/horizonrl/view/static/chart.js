"use strict";
/* Line charts as inline SVG: one chart per metric group, one line per series, steps on x. */

(function () {
  const W = 320;
  const H = 118;
  const PAD = { left: 44, right: 10, top: 10, bottom: 22 };
  const COLORS = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2"];
  const NS = "http://www.w3.org/2000/svg";

  function svg(tag, attrs, text) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  /* A tick label: three significant digits, whatever the magnitude (0.00125, 7.65, 1170). */
  const tick = (v) => String(Number(v.toPrecision(3)));

  function range(values) {
    let lo = Infinity;
    let hi = -Infinity;
    for (const v of values) {
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    if (!Number.isFinite(lo)) return [0, 1];
    if (lo === hi) {
      const pad = lo === 0 ? 1 : Math.abs(lo) * 0.1;
      lo -= pad;
      hi += pad;
    }
    return [lo, hi];
  }

  /* series: [{name, points: [[step, value|null], ...], band?: [[step, low, high], ...]}] -> a <figure>
     with the chart and its legend; a series' band (its 95% interval) is shaded behind its line. */
  V.lineChart = function (title, series, testid) {
    const drawn = series.filter((s) => s.points.some((p) => p[1] !== null));
    const fig = V.el("figure", { class: "chart", testid: testid || "chart" }, V.el("figcaption", {}, title));
    if (!drawn.length) {
      fig.append(V.el("div", { class: "muted" }, "no values yet"));
      return fig;
    }
    const xs = drawn.flatMap((s) => s.points.filter((p) => p[1] !== null).map((p) => p[0]));
    const ys = drawn.flatMap((s) => s.points.filter((p) => p[1] !== null).map((p) => p[1]));
    for (const s of drawn) for (const [, lo, hi] of s.band || []) ys.push(lo, hi);
    const [x0, x1] = range(xs);
    const [y0, y1] = range(ys);
    const sx = (x) => PAD.left + ((x - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
    const sy = (y) => H - PAD.bottom - ((y - y0) / (y1 - y0)) * (H - PAD.top - PAD.bottom);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart-svg", role: "img" });
    root.setAttribute("aria-label", title);
    const [plotW, plotH] = [W - PAD.left - PAD.right, H - PAD.top - PAD.bottom];
    root.append(svg("rect", { x: PAD.left, y: PAD.top, width: plotW, height: plotH, class: "plot" }));
    for (const y of [y0, (y0 + y1) / 2, y1]) {
      root.append(svg("line", { x1: PAD.left, x2: W - PAD.right, y1: sy(y), y2: sy(y), class: "grid" }));
      const label = { x: PAD.left - 4, y: sy(y) + 3, class: "tick", "text-anchor": "end" };
      root.append(svg("text", label, tick(y)));
    }
    root.append(svg("text", { x: PAD.left, y: H - 6, class: "tick" }, V.num(x0)));
    root.append(svg("text", { x: W - PAD.right, y: H - 6, class: "tick", "text-anchor": "end" }, V.num(x1)));
    const legend = V.el("div", { class: "legend" });
    drawn.forEach((s, i) => {
      const color = COLORS[i % COLORS.length];
      let d = "";
      let pen = "M";
      const shown = s.points.filter((p) => p[1] !== null);
      const band = s.band || [];
      if (band.length) {
        const upper = band.map(([x, , hi]) => `${sx(x).toFixed(1)},${sy(hi).toFixed(1)}`);
        const lower = band.map(([x, lo]) => `${sx(x).toFixed(1)},${sy(lo).toFixed(1)}`).reverse();
        const area = svg("path", { d: `M${upper.join("L")}L${lower.join("L")}Z`, fill: color, class: "band" });
        area.append(svg("title", {}, `${s.name}: 95% interval`));
        root.append(area);
        for (const [x, lo, hi] of band) {
          root.append(svg("line", { x1: sx(x), x2: sx(x), y1: sy(lo), y2: sy(hi), stroke: color, class: "whisker" }));
        }
      }
      for (const [x, y] of s.points) {
        if (y === null) {
          pen = "M";
          continue;
        }
        d += `${pen}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`;
        pen = "L";
      }
      root.append(svg("path", { d, stroke: color, class: "line" }));
      if (shown.length <= 60) {
        for (const [x, y] of shown) {
          const dot = svg("circle", { cx: sx(x), cy: sy(y), r: 2.2, fill: color });
          dot.append(svg("title", {}, `${s.name} · step ${V.num(x)}: ${V.num(y, 4)}`));
          root.append(dot);
        }
      }
      const last = shown[shown.length - 1];
      const swatch = V.el("i", { style: `background:${color}` });
      legend.append(V.el("span", { class: "key" }, swatch, `${s.name} `, V.el("b", {}, V.num(last[1], 4))));
    });
    fig.append(root, legend);
    return fig;
  };
})();
