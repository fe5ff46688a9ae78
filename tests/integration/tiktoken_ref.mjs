// The independent reference for tessera's byte-level BPE: the npm package js-tiktoken (OpenAI's
// tiktoken in JavaScript, with GPT-2's and cl100k's real ranks). Two uses:
//   node tiktoken_ref.mjs files ENCODING DIR    writes the tokenizer files tessera reads, made from
//       the package's ranks: for gpt2, DIR/vocab.json + DIR/merges.txt + DIR/tokenizer.json (the
//       GPT-2 kind); for cl100k_base, DIR/tokenizer.json of the LLaMA 3 kind (a Split of LLaMA 3's
//       pattern, then ByteLevel; ignore_merges; <|begin_of_text|> 100256, <|end_of_text|> 100257).
//       A merge is every split of a token into two tokens, ranked by the token's rank, which is
//       what tiktoken's merge-by-rank of the concatenation means.
//   node tiktoken_ref.mjs encode ENCODING LIST OUT   encodes every file named in LIST (one path a
//       line, read as UTF-8) as ordinary text and writes OUT: per file a uint32 count, then the
//       uint32 ids (little-endian).
// Run with NODE_PATH unset: the package is found from the working directory's node_modules.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(path.join(process.cwd(), "noop.js"));
const { Tiktoken } = require("js-tiktoken/lite");
const ranksOf = (name) => require(`js-tiktoken/ranks/${name}`);
const rankData = (name) => { const m = ranksOf(name); return m.default ?? m; };

const LLAMA3 =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" +
  "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function byteToUnicode() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const map = new Array(256);
  for (const b of bs) map[b] = String.fromCodePoint(b);
  let n = 0;
  for (let b = 0; b < 256; b++) if (map[b] === undefined) map[b] = String.fromCodePoint(256 + n++);
  return map;
}

// The ranks as {bytes (latin1 string) -> rank}, from the package's "! rank b64 b64 ..." text.
function ranks(rankData) {
  const out = new Map();
  for (const line of rankData.bpe_ranks.split("\n")) {
    if (!line) continue;
    const [_, offsetText, ...tokens] = line.split(" ");
    const offset = Number.parseInt(offsetText, 10);
    tokens.forEach((t, i) => out.set(Buffer.from(t, "base64").toString("latin1"), offset + i));
  }
  return out;
}

function writeFiles(name, dir) {
  const data = rankData(name);
  const r = ranks(data);
  const map = byteToUnicode();
  const spell = (latin1) => Array.from(latin1, (c) => map[c.charCodeAt(0)]).join("");
  const vocab = {};
  const merges = [];
  for (const [bytes, rank] of [...r.entries()].sort((a, b) => a[1] - b[1])) {
    vocab[spell(bytes)] = rank;
    for (let i = 1; i < bytes.length; i++) {
      const left = bytes.slice(0, i), right = bytes.slice(i);
      if (r.has(left) && r.has(right)) merges.push(spell(left) + " " + spell(right));
    }
  }
  const added = (content, id) => ({ id, content, single_word: false, lstrip: false, rstrip: false,
                                    normalized: false, special: true });
  fs.mkdirSync(dir, { recursive: true });
  const byteLevel = (regex) => ({ type: "ByteLevel", add_prefix_space: false, trim_offsets: true,
                                  use_regex: regex });
  let json;
  if (name === "gpt2") {
    vocab["<|endoftext|>"] = 50256;
    fs.writeFileSync(path.join(dir, "vocab.json"), JSON.stringify(vocab));
    fs.writeFileSync(path.join(dir, "merges.txt"), "#version: 0.2\n" + merges.join("\n") + "\n");
    json = { version: "1.0", added_tokens: [added("<|endoftext|>", 50256)], normalizer: null,
             pre_tokenizer: byteLevel(true), post_processor: byteLevel(true), decoder: byteLevel(true),
             model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "",
                      end_of_word_suffix: "", fuse_unk: false, byte_fallback: false, vocab, merges } };
  } else {
    json = { version: "1.0",
             added_tokens: [added("<|begin_of_text|>", 100256), added("<|end_of_text|>", 100257)],
             normalizer: null,
             pre_tokenizer: { type: "Sequence", pretokenizers: [
               { type: "Split", pattern: { Regex: LLAMA3 }, behavior: "Isolated", invert: false },
               byteLevel(false)] },
             post_processor: null, decoder: byteLevel(true),
             model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
                      end_of_word_suffix: null, fuse_unk: false, byte_fallback: false,
                      ignore_merges: true, vocab, merges } };
  }
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(json));
  console.log(`${name}: ${r.size} ranks, ${merges.length} merges -> ${dir}`);
}

function encodeFiles(name, list, out) {
  const enc = new Tiktoken(rankData(name));
  const files = fs.readFileSync(list, "utf8").split("\n").filter((l) => l);
  const parts = [];
  let total = 0;
  const t0 = Date.now();
  for (const f of files) {
    const text = fs.readFileSync(f, "utf8");
    const ids = enc.encode(text, [], []);  // ordinary text: special tokens' spelling included
    const buf = Buffer.alloc(4 + 4 * ids.length);
    buf.writeUInt32LE(ids.length, 0);
    ids.forEach((id, i) => buf.writeUInt32LE(id, 4 + 4 * i));
    parts.push(buf);
    total += ids.length;
  }
  fs.writeFileSync(out, Buffer.concat(parts));
  console.log(`${name}: ${files.length} files, ${total} tokens in ${(Date.now() - t0) / 1000} s`);
}

const [mode, name, a, b] = process.argv.slice(2);
if (mode === "files") writeFiles(name, a);
else if (mode === "encode") encodeFiles(name, a, b);
else {
  console.error("usage: tiktoken_ref.mjs files|encode ENCODING ...");
  process.exit(2);
}
