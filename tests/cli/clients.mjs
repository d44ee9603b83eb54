// clients.mjs: hearth serve through the real client libraries, unchanged: the `openai`
// package (chat, streamed chat, a multi-turn chat that resumes from the cache and answers as a
// cold server, tools passed through, a streamed tool call joined by the client's own stream
// helper) and `@anthropic-ai/sdk` (messages, streamed messages and tool_use,
// count_tokens, an error), and the Responses API (responses.create, responses.stream, a function
// call and its output), and structured output on the demo model (response_format json_schema
// read back by the openai client's parse and stream helpers; Anthropic's tool_choice naming a
// tool). Run by clients.sh with NODE_PATH at the installed packages.
// Prints "ok"/"FAIL" lines and "N passed, N failed".
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { readFileSync, existsSync, writeFileSync } from "node:fs";
import path from "node:path";

const require = createRequire(path.join(process.env.CLIENTS_DIR, "package.json"));
const { OpenAI } = require("openai");
const { Anthropic } = require("@anthropic-ai/sdk");

const HEARTH = process.env.HEARTH || "build/hearth";
const TMP = process.env.HEARTH_TMP || "/tmp";
let passed = 0, failed = 0;
function check(name, cond, detail = "") {
  if (cond) { passed++; console.log(`ok   ${name}`); }
  else { failed++; console.log(`FAIL ${name}${detail ? ": " + detail : ""}`); console.error(`    check failed: ${name} ${detail}`); }
}

async function server(model, ...flags) {
  return serverEnv(model, {}, ...flags);
}

async function serverEnv(model, env, ...flags) {
  const ready = path.join(TMP, `clients-port-${process.pid}-${Date.now()}`);
  const p = spawn(HEARTH, ["serve", "-m", model, "--port", "0", "--ready-file", ready, "-t", "2", ...flags],
                  { stdio: ["ignore", "ignore", "inherit"], env: { ...process.env, ...env } });
  for (let i = 0; i < 200 && !(existsSync(ready) && readFileSync(ready, "utf8").trim()); i++)
    await new Promise((r) => setTimeout(r, 50));
  const port = Number(readFileSync(ready, "utf8"));
  return { p, port, stop: () => new Promise((r) => { p.on("exit", r); p.kill("SIGTERM"); }) };
}

async function main() {
  const model = path.join(TMP, "clients-tiny.gguf");
  await new Promise((res, rej) => spawn(HEARTH, ["gen", "--preset", "tiny", "--quant", "q4_k_m", "--seed", "1", "-o", model],
                                        { stdio: "ignore" }).on("exit", (c) => (c === 0 ? res() : rej(c))));
  const s = await server(model, "-np", "2", "--api-key", "k-123");
  const oai = new OpenAI({ apiKey: "k-123", baseURL: `http://127.0.0.1:${s.port}/v1`, maxRetries: 0 });
  const messages = [{ role: "system", content: "You are terse." }, { role: "user", content: "Name a hearth." }];

  const models = await oai.models.list();
  check("openai: models.list", models.data.length === 1 && models.data[0].id === "clients-tiny.gguf");

  const r = await oai.chat.completions.create({ model: "m", messages, max_tokens: 10, temperature: 0 });
  const msg = r.choices[0].message;
  check("openai: chat.completions.create", r.object === "chat.completion" && msg.role === "assistant" &&
        typeof msg.content === "string" && r.usage.completion_tokens <= 10, JSON.stringify(r).slice(0, 300));

  const stream = await oai.chat.completions.create({ model: "m", messages, max_tokens: 10, temperature: 0, stream: true,
                                                     stream_options: { include_usage: true } });
  let text = "", usage = null, finish = null;
  for await (const ch of stream) {
    if (ch.usage) usage = ch.usage;
    const c = ch.choices[0];
    if (!c) continue;
    text += (c.delta.reasoning_content || "") + (c.delta.content || "");
    if (c.finish_reason) finish = c.finish_reason;
  }
  check("openai: streamed chat equals the whole answer", text === (msg.reasoning_content || "") + msg.content &&
        finish === r.choices[0].finish_reason && usage && usage.completion_tokens === r.usage.completion_tokens,
        `${JSON.stringify(text)} vs ${JSON.stringify(msg)}`);

  // multi-turn: from turn 2 on the cache serves the prefix, and the answer equals a cold server's
  const conv = [...messages];
  let answers = [];
  for (let turn = 1; turn <= 3; turn++) {
    const a = await oai.chat.completions.create({ model: "m", messages: conv, max_tokens: 24, temperature: 0 });
    answers.push(a);
    if (turn > 1) {
      const cached = a.usage.prompt_tokens_details.cached_tokens;
      check(`openai: turn ${turn} reports cached tokens and prefills only the rest`,
            cached > 0 && a.timings.prompt_n === a.usage.prompt_tokens - cached, JSON.stringify(a.usage));
    }
    conv.push({ role: "assistant", content: a.choices[0].message.content },
              { role: "user", content: `Turn ${turn + 1}: another?` });
  }
  // a cold server (one slot, nothing cached) gives every turn's answer bit for bit: the warm
  // one resumed from points at message starts and cut the rest of each prompt there too
  const cold = await server(model, "-np", "1", "--api-key", "k-123");
  const coldc = new OpenAI({ apiKey: "k-123", baseURL: `http://127.0.0.1:${cold.port}/v1`, maxRetries: 0 });
  for (let turn = 2; turn <= 3; turn++) {
    const er = await fetch(`http://127.0.0.1:${cold.port}/slots/0?action=erase`, { method: "POST", headers: { Authorization: "Bearer k-123" } });
    check(`cold server: slot 0 erased before turn ${turn}`, er.status === 200, String(er.status));
    const c = await coldc.chat.completions.create({ model: "m", messages: conv.slice(0, 2 * turn), max_tokens: 24, temperature: 0 });
    check(`openai: turn ${turn} equals a cold server's answer`,
          JSON.stringify(c.choices[0].message) === JSON.stringify(answers[turn - 1].choices[0].message) &&
          c.usage.prompt_tokens_details.cached_tokens === 0,
          `${JSON.stringify(c.choices[0].message)} vs ${JSON.stringify(answers[turn - 1].choices[0].message)} (cold cached ${c.usage.prompt_tokens_details.cached_tokens}, ${c.timings.cache}; warm: ${answers[turn - 1].timings.cache}, ${answers[turn - 1].timings.prompt_n} prefilled; lengths ${JSON.stringify(c.choices[0].message).length} ${JSON.stringify(answers[turn - 1].choices[0].message).length})`);
  }
  await cold.stop();

  const tools = [{ type: "function", function: { name: "get_weather", description: "weather by city",
                   parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
  const t = await oai.chat.completions.create({ model: "m", messages, tools, max_tokens: 6, temperature: 0 });
  check("openai: a request with tools is served", t.choices[0].message.role === "assistant");
  try {
    await oai.chat.completions.create({ model: "m", messages: [{ role: "wizard", content: "x" }] });
    check("openai: an unknown role is an error", false);
  } catch (e) {
    check("openai: an unknown role is a 400 the client raises", e.status === 400 && /role/.test(e.message), e.message);
  }
  const bad = new OpenAI({ apiKey: "wrong", baseURL: `http://127.0.0.1:${s.port}/v1`, maxRetries: 0 });
  try {
    await bad.models.list();
    check("openai: a wrong key is refused", false);
  } catch (e) {
    check("openai: a wrong key is a 401", e.status === 401, String(e.status));
  }

  // Anthropic
  const an = new Anthropic({ apiKey: "k-123", baseURL: `http://127.0.0.1:${s.port}`, maxRetries: 0 });
  const m = await an.messages.create({ model: "m", max_tokens: 10, temperature: 0, system: "You are terse.",
                                       messages: [{ role: "user", content: "Name a hearth." }] });
  const mtext = m.content.map((b) => (b.type === "text" ? b.text : b.type === "thinking" ? b.thinking : "")).join("");
  check("anthropic: messages.create", m.type === "message" && m.role === "assistant" && Array.isArray(m.content) &&
        ["end_turn", "max_tokens"].includes(m.stop_reason) && m.usage.output_tokens <= 10, JSON.stringify(m).slice(0, 300));
  check("anthropic: the same text as the OpenAI endpoint", mtext === (msg.reasoning_content || "") + msg.content,
        `${JSON.stringify(mtext)} vs ${JSON.stringify(msg)}`);
  const ms = an.messages.stream({ model: "m", max_tokens: 10, temperature: 0, system: "You are terse.",
                                  messages: [{ role: "user", content: "Name a hearth." }] });
  const final = await ms.finalMessage();
  const stext = final.content.map((b) => (b.type === "text" ? b.text : b.type === "thinking" ? b.thinking : "")).join("");
  check("anthropic: messages.stream's final message equals the whole one", stext === mtext &&
        final.stop_reason === m.stop_reason, `${JSON.stringify(stext)} vs ${JSON.stringify(mtext)}`);
  const ct = await an.messages.countTokens({ model: "m", messages: [{ role: "user", content: "Name a hearth." }] });
  check("anthropic: countTokens", ct.input_tokens > 0, JSON.stringify(ct));
  const turn2 = await an.messages.create({ model: "m", max_tokens: 6, temperature: 0, system: "You are terse.",
    messages: [{ role: "user", content: "Name a hearth." }, { role: "assistant", content: m.content.filter((b) => b.type === "text") },
               { role: "user", content: "Another?" }] });
  check("anthropic: turn 2 reads from the cache", turn2.usage.cache_read_input_tokens > 0, JSON.stringify(turn2.usage));
  try {
    await an.messages.create({ model: "m", messages: [{ role: "user", content: "x" }] });
    check("anthropic: max_tokens is required", false);
  } catch (e) {
    check("anthropic: a missing max_tokens is a 400 in Anthropic's shape", e.status === 400 &&
          e.error && e.error.type === "error" && e.error.error.type === "invalid_request_error", JSON.stringify(e.error));
  }
  await s.stop();
  await toolCalls(model);
  await responses(model);
  await structured();
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

// A tool call the clients' own stream helpers must put together: the random model cannot
// write one, so the server's test seam (HEARTH_TEST_REPLY) makes it the answer's tokens.
async function toolCalls(model) {
  const reply = path.join(TMP, "clients-reply.txt");
  writeFileSync(reply, "ok\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose\n</parameter>\n" +
                "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>");
  const want = JSON.stringify({ city: "San Jose", days: 3 });
  const s = await serverEnv(model, { HEARTH_TEST_REPLY: reply }, "-np", "1");
  const oai = new OpenAI({ apiKey: "x", baseURL: `http://127.0.0.1:${s.port}/v1`, maxRetries: 0 });
  const tools = [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: {
    city: { type: "string" }, days: { type: "integer" } } } } }];
  const messages = [{ role: "user", content: "weather?" }];
  const st = oai.chat.completions.stream({ model: "m", messages, tools, max_tokens: 100 });
  let pieces = 0;
  st.on("chunk", (ch) => { for (const tc of ch.choices[0]?.delta?.tool_calls || []) if (tc.function?.arguments) pieces++; });
  const fc = await st.finalChatCompletion();
  const call = fc.choices[0].message.tool_calls?.[0];
  check("openai: chat.completions.stream joins a streamed tool call", call && call.function.name === "get_weather" &&
        JSON.stringify(JSON.parse(call.function.arguments)) === want && pieces >= 3 &&
        fc.choices[0].finish_reason === "tool_calls", JSON.stringify(fc.choices[0]).slice(0, 300));
  const an = new Anthropic({ apiKey: "x", baseURL: `http://127.0.0.1:${s.port}`, maxRetries: 0 });
  const ms = an.messages.stream({ model: "m", max_tokens: 100, messages, tools: [{ name: "get_weather",
    input_schema: tools[0].function.parameters }] });
  let jsonDeltas = 0;
  ms.on("streamEvent", (e) => { if (e.type === "content_block_delta" && e.delta.type === "input_json_delta") jsonDeltas++; });
  const fm = await ms.finalMessage();
  const use = fm.content.find((b) => b.type === "tool_use");
  check("anthropic: messages.stream joins a streamed tool_use", use && use.name === "get_weather" &&
        JSON.stringify(use.input) === want && jsonDeltas >= 3 && fm.stop_reason === "tool_use",
        JSON.stringify(fm.content).slice(0, 300));
  await s.stop();
}

// OpenAI's Responses API through the client's own responses.create and responses.stream:
// the stream's finalResponse() must be the Response create() gives (ids and times aside), a
// function call must come back as a function_call item whose arguments the client joined from
// its deltas, and its output sent back as a function_call_output item must be served.
// (output_parsed and parsed: what the stream helper adds, the client's, not the server's)
function sameResponse(r) {
  const j = JSON.parse(JSON.stringify(r).replace(/"(resp|rs|msg|fc|call)_[0-9a-f]{16}/g, '"$1_X'));
  delete j.created_at; delete j.timings; delete j.usage.input_tokens_details.cached_tokens; delete j.output_parsed;
  for (const it of j.output) for (const c of it.type === "message" ? it.content : []) delete c.parsed;
  return JSON.stringify(j);
}

async function responses(model) {
  const s = await server(model, "-np", "1", "--api-key", "k-123");
  const oai = new OpenAI({ apiKey: "k-123", baseURL: `http://127.0.0.1:${s.port}/v1`, maxRetries: 0 });
  const body = { model: "m", instructions: "You are terse.", input: "Name a hearth.", max_output_tokens: 12,
                 temperature: 0, reasoning: { effort: "low" } };
  const r = await oai.responses.create(body);
  check("openai: responses.create", r.object === "response" && r.id.startsWith("resp_") &&
        ["completed", "incomplete"].includes(r.status) && r.output.length > 0 && typeof r.output_text === "string" &&
        r.usage.output_tokens <= 12 && r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens,
        JSON.stringify(r).slice(0, 300));
  // a reasoning item (its text as content; as summary where asked); a message item (output_text)
  for (const [effort, summary] of [["low", undefined], ["low", "auto"], ["none", undefined]]) {
    const b = { ...body, reasoning: { effort, summary } };
    const w = await oai.responses.create(b);
    const st = oai.responses.stream(b);
    const seen = [];
    st.on("event", (e) => seen.push(e.type));
    const f = await st.finalResponse();
    check(`openai: responses.stream's finalResponse equals responses.create (effort ${effort}${summary ? ", summary" : ""})`,
          sameResponse(f) === sameResponse(w) && f.output_text === w.output_text && seen[0] === "response.created" &&
          seen.length > 6 && w.output[0].type === (effort === "none" ? "message" : "reasoning") &&
          (effort === "low" || w.output_text.length > 0) &&
          (!summary || (w.output[0].summary.length === 1 && w.output[0].summary[0].type === "summary_text")), `${sameResponse(f).slice(0, 300)} vs ${sameResponse(w).slice(0, 300)}`);
  }
  const t2 = await oai.responses.create({ ...body, input: [{ role: "user", content: "Name a hearth." }, ...r.output,
                                                          { role: "user", content: "Another?" }] });
  check("openai: a second turn with the first's output items reads from the cache",
        t2.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(t2.usage));
  // structured output: text.format json_schema, parsed by the client's own responses.parse
  // and responses.stream (output_parsed); the random model writes the JSON only through the mask
  const schema = { type: "object", properties: { ok: { type: "boolean" }, n: { enum: [1, 2, 3] } },
                   required: ["ok", "n"], additionalProperties: false };
  const sbody = { model: "m", input: "JSON please", max_output_tokens: 60, temperature: 0, reasoning: { effort: "none" },
                  text: { format: { type: "json_schema", name: "flag", schema, strict: true } } };
  const pr = await oai.responses.parse(sbody);
  const ps = await oai.responses.stream(sbody).finalResponse();
  const fits = (o) => o && typeof o.ok === "boolean" && [1, 2, 3].includes(o.n) && Object.keys(o).length === 2;
  check("openai: text.format json_schema, output_parsed by responses.parse and responses.stream",
        pr.status === "completed" && fits(pr.output_parsed) && JSON.stringify(ps.output_parsed) === JSON.stringify(pr.output_parsed),
        `${pr.output_text} / ${JSON.stringify(ps.output_parsed)}`);
  try {
    await oai.responses.create({ model: "m", input: "x", previous_response_id: r.id });
    check("openai: previous_response_id is refused", false);
  } catch (e) {
    check("openai: previous_response_id is a 400 naming it", e.status === 400 && /previous_response_id/.test(e.message),
          e.message);
  }
  await s.stop();
  const reply = path.join(TMP, "clients-responses-reply.txt");
  writeFileSync(reply, "ok\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose\n</parameter>\n" +
                "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>");
  const t = await serverEnv(model, { HEARTH_TEST_REPLY: reply }, "-np", "1");
  const oc = new OpenAI({ apiKey: "x", baseURL: `http://127.0.0.1:${t.port}/v1`, maxRetries: 0 });
  const tools = [{ type: "function", name: "get_weather", description: "weather by city", strict: false,
                   parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } } } }];
  const ts = oc.responses.stream({ model: "m", input: "weather?", tools, max_output_tokens: 100 });
  let pieces = 0;
  ts.on("response.function_call_arguments.delta", () => pieces++);
  const fr = await ts.finalResponse();
  const call = fr.output.find((it) => it.type === "function_call");
  check("openai: responses.stream joins a streamed function call", call && call.name === "get_weather" &&
        JSON.stringify(JSON.parse(call.arguments)) === JSON.stringify({ city: "San Jose", days: 3 }) &&
        call.call_id && pieces >= 1 && fr.status === "completed", JSON.stringify(fr.output).slice(0, 300));
  const back = await oc.responses.create({ model: "m", tools, max_output_tokens: 100, input: [
    { role: "user", content: "weather?" }, ...fr.output,
    { type: "function_call_output", call_id: call?.call_id ?? "x", output: "sunny, 21 C" }] });
  check("openai: the call's function_call_output sent back is served", back.status === "completed" &&
        back.usage.input_tokens > fr.usage.input_tokens, JSON.stringify(back.usage));
  await t.stop();
}

// Structured output through the clients, on the demo model (unconstrained it writes no JSON
// and no call, so an answer that parses and fits its schema is the mask's work): the openai
// client's response_format json_schema, read back by its own chat.completions.parse and
// stream helpers (message.parsed), and @anthropic-ai/sdk's tool_choice {type: "tool", name}.
async function structured() {
  const demo = process.env.HEARTH_DEMO || "demo/hearth-demo-q8_0.gguf";
  if (!existsSync(demo)) { check(`the demo model ${demo} is there (structured output)`, false); return; }
  const s = await server(demo, "-np", "1", "--chat-template-file", "tests/fixtures/templates/Qwen3.5-4B.jinja");
  const oai = new OpenAI({ apiKey: "x", baseURL: `http://127.0.0.1:${s.port}/v1`, maxRetries: 0 });
  const person = { type: "object", properties: { name: { type: "string", maxLength: 12 }, age: { type: "integer" },
                                                 pet: { enum: ["cat", "dog", "none"] } },
                   required: ["name", "age", "pet"], additionalProperties: false };
  const personOk = (o) => o !== null && typeof o === "object" && !Array.isArray(o) &&
    JSON.stringify(Object.keys(o).sort()) === JSON.stringify(["age", "name", "pet"]) && typeof o.name === "string" &&
    o.name.length <= 12 && Number.isInteger(o.age) && ["cat", "dog", "none"].includes(o.pet);
  const body = { model: "m", messages: [{ role: "user", content: "Describe a person as JSON with name, age and pet." }],
                 max_tokens: 120, temperature: 0, chat_template_kwargs: { enable_thinking: false } };
  const plain = await oai.chat.completions.create(body);
  let plainJson = null;
  try { plainJson = JSON.parse(plain.choices[0].message.content); } catch { /* no JSON: what the mask must fix */ }
  check("openai: unconstrained, the demo model writes no such JSON", !personOk(plainJson),
        JSON.stringify(plain.choices[0].message.content).slice(0, 200));
  const rf = { ...body, response_format: { type: "json_schema", json_schema: { name: "person", strict: true, schema: person } } };
  // (the helpers throw where the content is no JSON or was cut: a failed check, named)
  const settle = (q) => q.then((v) => [v, ""], (e) => [null, String(e)]);
  const [p, perr] = await settle(oai.chat.completions.parse(rf));
  const parsed = p?.choices[0].message.parsed;
  check("openai: chat.completions.parse with response_format json_schema: message.parsed fits the schema",
        p && personOk(parsed) && p.choices[0].finish_reason === "stop", perr || JSON.stringify(p.choices[0]).slice(0, 300));
  const [fc, ferr] = await settle(oai.chat.completions.stream(rf).finalChatCompletion());
  check("openai: chat.completions.stream with json_schema: the same message.parsed",
        p && fc && JSON.stringify(fc.choices[0].message.parsed) === JSON.stringify(parsed) &&
        fc.choices[0].message.content === p.choices[0].message.content, ferr || JSON.stringify(fc.choices[0]).slice(0, 300));
  const an = new Anthropic({ apiKey: "x", baseURL: `http://127.0.0.1:${s.port}`, maxRetries: 0 });
  const tools = [
    { name: "get_weather", input_schema: { type: "object", properties: { unit: { type: "string", enum: ["C", "F"] },
                                                                          days: { type: "integer" } }, required: ["unit", "days"] } },
    { name: "get_time", input_schema: { type: "object", properties: { zone: { type: "string", enum: ["UTC", "CET"] } },
                                        required: ["zone"] } }];
  const ab = { model: "m", max_tokens: 120, temperature: 0, thinking: { type: "disabled" }, tools,
               messages: [{ role: "user", content: "Weather in Oslo?" }] };
  const free = await an.messages.create(ab);
  check("anthropic: unconstrained, the demo model calls no tool", !free.content.some((b) => b.type === "tool_use"),
        JSON.stringify(free.content).slice(0, 200));
  const forced = { ...ab, tool_choice: { type: "tool", name: "get_time" } };
  const m = await an.messages.create(forced);
  const use = m.content.filter((b) => b.type === "tool_use");
  check("anthropic: tool_choice {type: tool, name}: one tool_use of that tool, its input fitting the schema",
        use.length === 1 && use[0].name === "get_time" && JSON.stringify(Object.keys(use[0].input)) === '["zone"]' &&
        ["UTC", "CET"].includes(use[0].input.zone) && use[0].id.startsWith("toolu_") && m.stop_reason === "tool_use",
        JSON.stringify(m).slice(0, 300));
  const f = await an.messages.stream(forced).finalMessage();
  const fuse = f.content.filter((b) => b.type === "tool_use");
  check("anthropic: messages.stream with tool_choice {type: tool, name}: the same tool_use",
        fuse.length === 1 && use.length === 1 && fuse[0].name === use[0].name &&
        JSON.stringify(fuse[0].input) === JSON.stringify(use[0].input) && f.stop_reason === "tool_use",
        JSON.stringify(f.content).slice(0, 300));
  await s.stop();
}

main().catch((e) => { console.log(`FAIL clients.mjs: ${e.stack || e}`); console.log(`${passed} passed, ${failed + 1} failed`); process.exit(1); });
