// Reference answers for Troupe's tokenizer tests, from @huggingface/tokenizers (an independent
// JavaScript implementation of Hugging Face tokenizers).
//
// Usage: node tokenizer_oracle.mjs REQUEST.json > ANSWER.json
// REQUEST: {"tokenizer": path to tokenizer.json, "config": path to tokenizer_config.json or null,
//           "texts": [...], "prefix_decode_count": N,
//           "byte_strings": [[bytes...], ...]   (optional: TextDecoder reference for broken UTF-8)}
// ANSWER:  {"results": [{"ids", "ids_plain", "decoded", "decoded_skip", "decoded_plain", "prefixes"?}],
//           "nfc": [text.normalize("NFC") for each text], "byte_strings": [decoded...]}
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "node:fs";

const request = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const tokenizer_json = JSON.parse(fs.readFileSync(request.tokenizer, "utf8"));
const config = request.config ? JSON.parse(fs.readFileSync(request.config, "utf8")) : {};
const tokenizer = new Tokenizer(tokenizer_json, config);

// The library refuses to decode an empty list; the answer there is the empty text.
const decode = (ids, skip) => (ids.length === 0 ? "" : tokenizer.decode(ids, { skip_special_tokens: skip }));

const results = request.texts.map((text, index) => {
  const ids = tokenizer.encode(text).ids;
  const ids_plain = tokenizer.encode(text, { add_special_tokens: false }).ids;
  const result = {
    ids,
    ids_plain,
    decoded: decode(ids, false),
    decoded_skip: decode(ids, true),
    decoded_plain: decode(ids_plain, false),
  };
  if (index < (request.prefix_decode_count ?? 0)) {
    result.prefixes = [];
    for (let k = 1; k <= ids.length; ++k) result.prefixes.push(decode(ids.slice(0, k), true));
  }
  return result;
});

const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
const answer = {
  results,
  nfc: request.texts.map((t) => t.normalize("NFC")),
  byte_strings: (request.byte_strings ?? []).map((b) => decoder.decode(Uint8Array.from(b))),
};
process.stdout.write(JSON.stringify(answer));
