// webui_test.mjs: the chat page at / (src/serve/webui.html) in a real browser: Debian's
// chromium, headless, driven by puppeteer-core (installed by webui.sh), against `hearth serve`
// on the demo model. Keyboard only: a two-turn chat streams into the page, turn 2's bar shows
// the tokens it resumed from the cache and why, an edit of turn 1 shows its new reason, Esc
// stops a long answer and the server answers the next turn; the conversation survives a
// reload (localStorage); a phone's width has no sideways scroll; thinking (collapsed) and tool
// calls through the test seam HEARTH_TEST_REPLY with an API key; --no-webui makes / a 404.
// WEBUI_SCREENSHOT=FILE writes the page after turn 2 (docs/webui.png).
// Prints "ok"/"FAIL" lines and "N passed, N failed, N skipped".
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { readFileSync, existsSync, writeFileSync, statSync } from "node:fs";
import path from "node:path";

const require = createRequire(path.join(process.env.WEBUI_NPM_DIR, "package.json"));
const puppeteer = require("puppeteer-core");

const HEARTH = process.env.HEARTH || "build/hearth";
const TMP = process.env.HEARTH_TMP || "/tmp";
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const MODEL = "demo/hearth-demo-q8_0.gguf";
const PAGE_FILE = "src/serve/webui.html";
const PAGE_MAX = 60 * 1024;
let passed = 0, failed = 0;
function check(name, cond, detail = "") {
  if (cond) { passed++; console.log(`ok   ${name}`); }
  else { failed++; console.log(`FAIL ${name}${detail ? ": " + detail : ""}`); }
}

async function server(flags, env = {}) {
  const ready = path.join(TMP, `webui-port-${process.pid}-${Date.now()}`);
  const p = spawn(HEARTH, ["serve", "-m", MODEL, "--port", "0", "--ready-file", ready, "-t", "2", ...flags],
                  { stdio: ["ignore", "ignore", "inherit"], env: { ...process.env, ...env } });
  for (let i = 0; i < 200 && !(existsSync(ready) && readFileSync(ready, "utf8").trim()); i++)
    await new Promise((r) => setTimeout(r, 50));
  const port = Number(readFileSync(ready, "utf8"));
  const url = `http://127.0.0.1:${port}`;
  return { p, url, stop: () => new Promise((r) => { if (p.exitCode != null) r(); p.on("exit", r); p.kill("SIGTERM"); }) };
}

// the last answer as the page shows it
function lastAnswer(page) {
  return page.evaluate(() => {
    const a = [...document.querySelectorAll("#log .msg.asst")].pop();
    if (!a) return null;
    const q = (s) => { const e = a.querySelector(s); return e ? e.textContent : null; };
    const th = a.querySelector("details.think"), c = a.querySelector(".bar .c");
    return { state: a.dataset.state, body: q(".body"), cached: Number(q(".cached-n")), prefill: Number(q(".prefill-n")),
             why: q(".why"), speed: q(".speed"), note: q(".note"), err: q(".err"), think: th ? th.textContent : null,
             thinkOpen: th ? th.open : null, tools: [...a.querySelectorAll(".tool")].map((t) => t.textContent),
             cachedWidth: c ? parseFloat(c.style.width) : null, n: document.querySelectorAll("#log .msg.asst").length };
  });
}

// waits until the page holds n answers and the last is no longer streaming
async function answered(page, n, ms = 30000) {
  await page.waitForFunction((k) => {
    const a = document.querySelectorAll("#log .msg.asst");
    return a.length === k && a[k - 1].dataset.state && a[k - 1].dataset.state !== "streaming";
  }, { timeout: ms }, n);
  return lastAnswer(page);
}

async function setField(page, id, value) {
  await page.focus("#" + id);
  await page.keyboard.down("Control"); await page.keyboard.press("KeyA"); await page.keyboard.up("Control");
  await page.keyboard.press("Backspace");
  if (value) await page.keyboard.type(value);
}

async function say(page, text) {
  await page.focus("#input");
  await page.keyboard.type(text);
  await page.keyboard.press("Enter");
}

async function slotsIdle(url, ms) {
  for (const t0 = Date.now(); Date.now() - t0 < ms;) {
    const s = await (await fetch(url + "/slots")).json();
    if (s.every((x) => !x.is_processing)) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return false;
}

async function main() {
  const bytes = readFileSync(PAGE_FILE);
  check(`the page is at most 60 KiB (${bytes.length} bytes)`, bytes.length <= PAGE_MAX);
  check("the page loads nothing: no URL, src=, href=, url( or @import in it",
        !/https?:|\bsrc=|\bhref=|url\(|@import/i.test(bytes.toString()));

  const A = await server(["-np", "1"]);
  const servers = [A];
  let browser;
  try {
    const r = await fetch(A.url + "/");
    const body = Buffer.from(await r.arrayBuffer());
    check("GET / answers the embedded page as text/html; charset=utf-8", r.status === 200 &&
          r.headers.get("content-type") === "text/html; charset=utf-8" && body.equals(bytes), `${r.status} ${r.headers.get("content-type")}`);
    const props = await (await fetch(A.url + "/props")).json();
    check("/props says ui: true", props.ui === true);

    browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true,
                                       args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
    const page = await browser.newPage();
    const foreign = [], errors = [];
    page.on("request", (q) => { if (!q.url().startsWith(A.url + "/") && !q.url().startsWith("data:")) foreign.push(q.url()); });
    page.on("pageerror", (e) => errors.push(e.message));
    await page.setViewport({ width: 1000, height: 640 });
    await page.goto(A.url + "/", { waitUntil: "load" });
    await page.waitForFunction(() => document.getElementById("ctx").textContent !== "", { timeout: 10000 });
    const head = await page.evaluate(() => [document.getElementById("model").textContent, document.getElementById("ctx").textContent]);
    check("the model and its context from /props", head[0] === "hearth-demo-q8_0.gguf" && head[1].includes("4096"), head.join(" | "));

    // the settings, by keyboard: a system prompt, greedy sampling, short answers
    await page.focus("#settings summary");
    await page.keyboard.press("Enter");
    await setField(page, "system", "You are a helpful assistant.");
    await setField(page, "temperature", "0");
    await setField(page, "max_tokens", "48");
    const stored = await page.evaluate(() => JSON.parse(localStorage.getItem("hearth.settings")));
    check("settings are kept in localStorage", stored.temperature === "0" && stored.max_tokens === "48" &&
          stored.system === "You are a helpful assistant.", JSON.stringify(stored));

    // every change of the answer's text while it streams (the page draws each chunk it reads)
    await page.evaluate(() => {
      window.partials = [];
      new MutationObserver(() => {
        const a = [...document.querySelectorAll("#log .msg.asst")].pop();
        if (a && a.dataset.state === "streaming") window.partials.push(a.querySelector(".body").textContent.length);
      }).observe(document.getElementById("log"), { subtree: true, childList: true, characterData: true });
    });
    await say(page, "Who are you?");
    const t1 = await answered(page, 1);
    check("turn 1: Enter sends, the answer streams into the page and ends", t1.state === "done" && t1.body.length > 0,
          JSON.stringify(t1));
    check("turn 1's bar: nothing cached, the whole prompt prefilled, the reason and both speeds",
          t1.cached === 0 && t1.prefill > 0 && /^resumed at 0: no point/.test(t1.why) && /prompt \d+ tok\/s · decode [\d.]+ tok\/s/.test(t1.speed),
          JSON.stringify(t1));
    await say(page, "What does John 3:16 say?");
    const t2 = await answered(page, 2);
    const partials = await page.evaluate(() => window.partials);
    check("turn 2: the answer streams into the page and ends", t2.state === "done" && t2.body.length > 0, JSON.stringify(t2));
    check("the answers were drawn in pieces while they streamed",
          partials.some((n) => n > 0) && new Set(partials).size >= 3, JSON.stringify(partials).slice(0, 200));
    check("turn 2's bar: tokens from the cache in their colour, resumed at that point, and why",
          t2.cached > 0 && t2.prefill > 0 && t2.cachedWidth > 0 && t2.why.startsWith(`resumed at ${t2.cached}: point at ${t2.cached} `),
          JSON.stringify(t2));
    const slots = await (await fetch(A.url + "/slots")).json();
    check("the bar's numbers are the server's (/slots)", slots[0].n_prompt_tokens_cache === t2.cached &&
          slots[0].n_prompt_tokens_processed === t2.prefill, JSON.stringify(slots[0]).slice(0, 300));
    if (process.env.WEBUI_SCREENSHOT) {
      await page.evaluate(() => { document.activeElement.blur(); });
      await page.screenshot({ path: process.env.WEBUI_SCREENSHOT, type: "png" });
    }

    // edit turn 1 (keyboard: the Edit button, Enter), the conversation drops what followed
    await page.focus("#log .msg.user .edit");
    await page.keyboard.press("Enter");
    const editing = await page.evaluate(() => document.activeElement.getAttribute("aria-label"));
    await page.keyboard.down("Control"); await page.keyboard.press("KeyA"); await page.keyboard.up("Control");
    await page.keyboard.type("Who made you?");
    await page.keyboard.press("Enter");
    const t3 = await answered(page, 1);
    const users = await page.evaluate(() => [...document.querySelectorAll("#log .msg.user .body")].map((b) => b.textContent));
    check("edit: the focused Edit button opens the message for editing", editing === "Edit message", String(editing));
    check("edit: resent as the only turn, what followed dropped", t3.state === "done" && users.length === 1 &&
          users[0] === "Who made you?", JSON.stringify(users));
    check("edit: the bar shows the new reason (resumed before turn 1's message, where it diverged)",
          t3.cached > 0 && t3.cached < t2.cached && t3.why !== t2.why && /diverged at token \d+/.test(t3.why),
          `${t3.why} after ${t2.why}`);

    // stop: a long answer (ignore_eos), Esc while it streams; the slot is freed and the next turn answered
    await setField(page, "max_tokens", "3000");
    await setField(page, "extra", '{"ignore_eos": true}');
    await say(page, "Tell me a long story.");
    await page.waitForFunction(() => {
      const a = [...document.querySelectorAll("#log .msg.asst")].pop();
      return a && a.dataset.state === "streaming" && a.querySelector(".body").textContent.length > 20;
    }, { timeout: 20000 });
    const stopVisible = await page.evaluate(() => !document.getElementById("stop").hidden && document.getElementById("send").hidden);
    const tStop = Date.now();
    await page.keyboard.press("Escape");
    const t4 = await answered(page, 2, 10000);
    check("stop: the Stop button shows while streaming; Esc stops the answer, what came is kept",
          stopVisible && t4.state === "stopped" && t4.note === "stopped" && t4.body.length > 20, JSON.stringify(t4).slice(0, 300));
    const idle = await slotsIdle(A.url, 3000);
    const s4 = await (await fetch(A.url + "/slots")).json();
    const decoded = s4[0].next_token[0].n_decoded;
    check(`stop: the server frees the slot (/slots idle ${Date.now() - tStop} ms after Esc, ${decoded} of 3000 tokens)`,
          idle && decoded < 3000, JSON.stringify(s4[0]).slice(0, 300));
    await setField(page, "max_tokens", "24");
    await setField(page, "extra", "");
    await say(page, "Thank you.");
    const t5 = await answered(page, 3, 15000);
    check("stop: the server answers the next turn", t5.state === "done" && t5.body.length > 0 && t5.prefill > 0, JSON.stringify(t5));

    // the conversation is kept in localStorage: a reload shows it again, bars and all
    const before = await page.evaluate(() => document.querySelectorAll("#log .msg").length);
    await page.reload({ waitUntil: "load" });
    const after = await page.evaluate(() => [document.querySelectorAll("#log .msg").length, document.querySelectorAll("#log .turn").length,
                                             document.querySelectorAll("#log .note").length, document.querySelectorAll("#convs li").length]);
    check("reload: the conversation comes back from localStorage, the answers' bars and the stopped one's note",
          after[0] === before && before === 6 && after[1] === 2 && after[2] === 1 && after[3] === 1, `${before} -> ${after}`);

    // a phone's width: no sideways scroll; the menu (keyboard) shows the conversations
    await page.setViewport({ width: 390, height: 844, isMobile: true, hasTouch: true });
    const phone = await page.evaluate(() => [document.documentElement.scrollWidth, getComputedStyle(document.getElementById("side")).display,
                                             document.getElementById("input").getBoundingClientRect().right]);
    await page.focus("#menu");
    await page.keyboard.press("Enter");
    const shown = await page.evaluate(() => getComputedStyle(document.getElementById("side")).display);
    await page.keyboard.press("Escape");
    const hidden = await page.evaluate(() => getComputedStyle(document.getElementById("side")).display);
    check("390 px wide: no sideways scroll, the composer in view, the side panel behind the menu key",
          phone[0] <= 390 && phone[1] === "none" && phone[2] <= 390 && shown === "block" && hidden === "none",
          `${phone} ${shown} ${hidden}`);
    check("the page fetched nothing from another origin", foreign.length === 0, foreign.join(" "));
    check("no script errors in the page", errors.length === 0, errors.join(" | "));
    await page.close();

    // --no-webui: / is unknown, as any path
    const B = await server(["--no-webui"]);
    servers.push(B);
    const rb = await fetch(B.url + "/");
    const jb = await rb.json().catch(() => null);
    const pb = await (await fetch(B.url + "/props")).json();
    check("--no-webui: GET / is a 404 JSON error, /props says ui: false", rb.status === 404 && jb && jb.error &&
          jb.error.code === 404 && pb.ui === false, `${rb.status} ${JSON.stringify(jb)}`);
    await B.stop();

    // an API key: the page loads without it and asks for it; thinking collapsed and a tool call
    // shown, through the test seam (every answer is the reply file's tokens)
    const reply = path.join(TMP, `webui-reply-${process.pid}.txt`);
    writeFileSync(reply, "<think>\nplan it\n</think>\n\nLooking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n" +
                         "</parameter>\n</function>\n</tool_call>");
    const C = await server(["--api-key", "k-webui"], { HEARTH_TEST_REPLY: reply });
    servers.push(C);
    const pc = await browser.newPage();
    pc.on("pageerror", (e) => errors.push(e.message));
    await pc.setViewport({ width: 1000, height: 640 });
    const rc = await pc.goto(C.url + "/", { waitUntil: "load" });
    await pc.waitForFunction(() => document.getElementById("model").textContent === "API key needed", { timeout: 10000 });
    const focused = await pc.evaluate(() => document.activeElement.id);
    check("--api-key: the page loads without the key, asks for it and focuses its field", rc.status() === 200 && focused === "apikey",
          `${rc.status()} ${focused}`);
    await pc.keyboard.type("k-webui");
    await pc.keyboard.press("Tab");
    await pc.waitForFunction(() => document.getElementById("model").textContent === "hearth-demo-q8_0.gguf", { timeout: 10000 });
    check("--api-key: with the key typed in, /props answers", true);
    const tools = [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }];
    await setField(pc, "extra", JSON.stringify({ tools }));
    await say(pc, "weather?");
    const t6 = await answered(pc, 1);
    check("thinking shown collapsed, the content apart, the tool call shown with its arguments",
          t6.state === "done" && t6.thinkOpen === false && t6.think.includes("plan it") && t6.body === "Looking.\n" &&
          t6.tools.length === 1 && t6.tools[0].includes("get_weather") && t6.tools[0].includes('{"city":"Oslo"}'), JSON.stringify(t6));
    const key = await pc.evaluate(() => localStorage.getItem("hearth.apikey"));
    check("--api-key: the key is kept in localStorage", key === "k-webui");
  } catch (e) {
    check("the browser test ran to its end", false, e.stack || String(e));
  } finally {
    if (browser) await browser.close();
    for (const s of servers) await s.stop();
  }
  console.log(`${passed} passed, ${failed} failed, 0 skipped`);
  process.exit(failed ? 1 : 0);
}

main();
