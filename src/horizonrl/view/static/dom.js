"use strict";
/* Helpers every page of the viewer uses: building elements, calling the API, formatting numbers and
   times, links between pages, and polling. Everything hangs off one global, V. */

const V = (window.V = window.V || {});

/* el("a", {class, testid, href, text, onclick, ...}, ...children): an element; null children skipped. */
V.el = function (tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "testid") node.dataset.testid = value;
    else if (key === "text") node.textContent = value;
    else if (key === "style") node.style.cssText = value; // CSSOM: allowed by the page's CSP, an attribute is not
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
};

/* Replace node's children (null, undefined and false children are skipped). */
V.fill = function (node, ...children) {
  const kept = children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false);
  node.replaceChildren(...kept);
  return node;
};

/* The JSON of an API call; a non-2xx answer throws an Error carrying the server's detail. */
V.api = async function (path, options) {
  const res = await fetch(path, options);
  let body = null;
  try {
    body = await res.json();
  } catch (e) {
    body = null;
  }
  if (!res.ok) {
    const detail = body && body.detail;
    const text = typeof detail === "string" ? detail : detail ? JSON.stringify(detail) : res.statusText;
    const err = new Error(`${res.status}: ${text}`);
    err.status = res.status;
    throw err;
  }
  return body;
};

/* A query string of the given params, leaving out empty ones. */
V.query = function (params) {
  const kept = Object.entries(params).filter(([, v]) => v !== "" && v !== null && v !== undefined);
  return new URLSearchParams(kept).toString();
};

const ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
V.escape = (text) => String(text).replace(/[&<>"']/g, (c) => ENTITIES[c]);

V.num = function (x, digits = 3) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (Number.isInteger(x)) return String(x);
  const abs = Math.abs(x);
  if (abs >= 1000) return x.toFixed(0);
  if (abs !== 0 && abs < 0.001) return x.toExponential(2);
  return String(Number(x.toFixed(digits)));
};

V.pct = function (x) {
  if (x === null || x === undefined) return "–";
  return `${(100 * x).toFixed(Number.isInteger(100 * x) ? 0 : 1)}%`;
};

V.ago = function (epoch) {
  if (!epoch) return "–";
  const s = Math.max(0, Date.now() / 1000 - epoch);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(epoch * 1000).toISOString().slice(0, 16).replace("T", " ");
};

/* A step label as shown: 12 -> "step 12"; "eval:base" as it is. */
V.stepText = function (step) {
  if (step === null || step === undefined) return "";
  return typeof step === "number" ? `step ${step}` : step;
};

const enc = encodeURIComponent;
V.runHref = (run, params) => `#/run/${enc(run)}${params && V.query(params) ? "?" + V.query(params) : ""}`;
V.trajHref = (run, file, index) => `#/run/${enc(run)}/trajectory?${V.query({ file, index })}`;
V.compareHref = (run, task) => `#/run/${enc(run)}/compare?${V.query({ task })}`;
V.runInfoApi = (run) => `api/runs/${enc(run)}`;
V.runApi = (run, rest) => `${V.runInfoApi(run)}/${rest}`;

/* How often a page that shows a run looks for what was written since. */
V.POLL_MS = 3000;

V.badge = (text, kind, testid) => V.el("span", { class: `badge ${kind || ""}`, testid }, text);

V.finishBadge = (finish) => V.badge(finish || "?", finish === "finished" ? "ok" : "warn", "finish");

V.successBadge = function (success) {
  if (success === null || success === undefined) return V.badge("–", "");
  return success ? V.badge("success", "ok") : V.badge("fail", "");
};

V.errorBox = (message) => V.el("div", { class: "error-box", testid: "error" }, message);

/* Call fn now and every ms while the page is open (skipped while the tab is hidden); the header shows
   whether the last call worked. Returns {stop}. */
V.poll = function (fn, ms) {
  let alive = true;
  let timer = null;
  const live = document.getElementById("live");
  const tick = async () => {
    if (!alive) return;
    if (!document.hidden) {
      try {
        await fn();
        live.textContent = `live · ${new Date().toLocaleTimeString()}`;
        live.className = "live ok";
      } catch (e) {
        live.textContent = `not updating: ${e.message}`;
        live.className = "live bad";
      }
    }
    if (alive) timer = setTimeout(tick, ms);
  };
  tick();
  return {
    stop() {
      alive = false;
      clearTimeout(timer);
      live.textContent = "";
      live.className = "live";
    },
  };
};
