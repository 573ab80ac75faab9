/* PII redactor: an output-hook plugin, in plain C99, that replaces e-mail addresses and phone
 * numbers in a request's streamed text with "[email]" and "[phone]".
 *
 * A template to copy. What it shows:
 *  - per-request state (the text held back) kept by request id, guarded by a mutex because the
 *    host may call a plugin instance from several threads at once;
 *  - text split across deltas: "reach me at ann" + "@example.com" must not leak "ann". So the
 *    plugin emits only text no address or number can still reach into, holds the rest back, and
 *    releases it on the request's final delta (is_final), as the ABI requires;
 *  - on_request_end frees what a request that failed or was aborted left behind.
 *
 * Configuration (JSON): {"max_hold_bytes": 256, "word": "Lily"}: held text beyond max_hold_bytes
 * is redacted and released anyway (bounds the memory and the delay a long run of digits could
 * cause); `word` (optional, letters and digits, at most 63 bytes) is one more word to redact, as
 * "[redacted]": a name, a code word.
 * Build: cc -std=c99 -shared -fPIC -I include examples/plugins/pii_redactor.c (CMake does it). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <troupe/plugin.h>

typedef struct held_text {
  int64_t request_id;
  char* text; /* [len], not NUL-terminated */
  size_t len;
  struct held_text* next;
} held_text;

typedef struct redactor {
  pthread_mutex_t mutex;
  held_text* held; /* one per request with text held back */
  size_t max_hold_bytes;
  char word[64]; /* "" : none */
} redactor;

static int is_alnum(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int is_digit(char c) { return c >= '0' && c <= '9'; }
/* Characters an e-mail address is made of. */
static int in_email(char c) { return is_alnum(c) || c == '.' || c == '_' || c == '%' || c == '+' || c == '-' || c == '@'; }
/* Characters a phone number is made of: "+1 (555) 123-4567". */
static int in_phone(char c) { return is_digit(c) || c == ' ' || c == '+' || c == '(' || c == ')' || c == '-' || c == '.'; }

/* A growing output buffer. */
typedef struct buffer {
  char* data;
  size_t len, cap;
  int failed;
} buffer;

static void append(buffer* b, const char* s, size_t n) {
  if (b->failed) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->len + n) cap *= 2;
    char* grown = (char*)realloc(b->data, cap);
    if (!grown) {
      b->failed = 1;
      return;
    }
    b->data = grown;
    b->cap = cap;
  }
  memcpy(b->data + b->len, s, n);
  b->len += n;
}

/* Is text[begin, end) an e-mail address: something@domain.tld? */
static int is_email(const char* text, size_t begin, size_t end) {
  size_t at = begin, i;
  while (at < end && text[at] != '@') ++at;
  if (at == begin || at >= end) return 0;
  for (i = at + 1; i + 1 < end; ++i) {
    if (text[i] == '.' && i > at + 1 && is_alnum(text[i + 1])) return 1;
  }
  return 0;
}

/* The number of digits in text[begin, end). */
static size_t count_digits(const char* text, size_t begin, size_t end) {
  size_t n = 0;
  for (; begin < end; ++begin) n += is_digit(text[begin]);
  return n;
}

/* Appends text[0, len) to out with every complete address and number replaced. */
static void redact(const redactor* r, const char* text, size_t len, buffer* out) {
  size_t i = 0;
  while (i < len) {
    size_t end;
    if (in_email(text[i]) && text[i] != '@') {
      /* An e-mail run: the longest stretch of e-mail characters from here. */
      end = i;
      while (end < len && in_email(text[end])) ++end;
      while (end > i && text[end - 1] == '.') --end; /* a sentence's full stop is not the domain's */
      if (is_email(text, i, end)) {
        append(out, "[email]", 7);
        i = end;
        continue;
      }
    }
    if (is_digit(text[i]) || text[i] == '+' || text[i] == '(') {
      /* A phone run, trimmed back to its last digit: 7 digits or more make a number. */
      size_t last = i;
      end = i;
      while (end < len && in_phone(text[end])) {
        if (is_digit(text[end])) last = end + 1;
        ++end;
      }
      if (last > i && count_digits(text, i, last) >= 7) {
        append(out, "[phone]", 7);
        i = last;
        continue;
      }
    }
    /* Not the start of either: copy a whole word (so "a1234567" stays), else one character. */
    end = i + 1;
    if (is_alnum(text[i])) {
      while (end < len && is_alnum(text[end])) ++end;
    }
    if (r->word[0] && end - i == strlen(r->word) && memcmp(text + i, r->word, end - i) == 0) {
      append(out, "[redacted]", 10);
    } else {
      append(out, text + i, end - i);
    }
    i = end;
  }
}

/* Where the text stops being safe to release: the start of a trailing run that more text could
 * turn into an address or a number. */
static size_t safe_prefix(const char* text, size_t len) {
  size_t email_start = len, phone_start = len, i;
  while (email_start > 0 && in_email(text[email_start - 1])) --email_start;
  i = len;
  while (i > 0 && in_phone(text[i - 1])) --i;
  while (i < len && text[i] == ' ') ++i; /* a leading space belongs to the text before */
  if (count_digits(text, i, len) > 0) phone_start = i;
  return email_start < phone_start ? email_start : phone_start;
}

static held_text** find(redactor* r, int64_t request_id) {
  held_text** at = &r->held;
  while (*at && (*at)->request_id != request_id) at = &(*at)->next;
  return at;
}

static void drop(held_text** at) {
  held_text* gone = *at;
  *at = gone->next;
  free(gone->text);
  free(gone);
}

static troupe_plugin_status on_output(void* state, const troupe_output* output, troupe_reply* reply) {
  redactor* r = (redactor*)state;
  buffer pending = {0, 0, 0, 0}, out = {0, 0, 0, 0};
  held_text** at;
  size_t cut;
  troupe_plugin_status status = TROUPE_PLUGIN_OK;

  pthread_mutex_lock(&r->mutex);
  at = find(r, output->request_id);
  if (*at) {
    append(&pending, (*at)->text, (*at)->len);
    drop(at);
  }
  append(&pending, output->text, output->text_len);
  cut = output->is_final || pending.len > r->max_hold_bytes ? pending.len : safe_prefix(pending.data, pending.len);
  redact(r, pending.data, cut, &out);
  if (cut < pending.len && !pending.failed) {
    held_text* keep = (held_text*)malloc(sizeof(held_text));
    char* text = (char*)malloc(pending.len - cut);
    if (keep && text) {
      memcpy(text, pending.data + cut, pending.len - cut);
      keep->request_id = output->request_id;
      keep->text = text;
      keep->len = pending.len - cut;
      keep->next = r->held;
      r->held = keep;
    } else {
      free(keep);
      free(text);
      pending.failed = 1;
    }
  }
  pthread_mutex_unlock(&r->mutex);

  if (pending.failed || out.failed) {
    reply->set_message(reply, "out of memory", 13);
    status = TROUPE_PLUGIN_ERROR;
  } else {
    reply->set_text(reply, out.data ? out.data : "", out.len);
  }
  free(pending.data);
  free(out.data);
  return status;
}

static void on_request_end(void* state, int64_t request_id) {
  redactor* r = (redactor*)state;
  held_text** at;
  pthread_mutex_lock(&r->mutex);
  at = find(r, request_id);
  if (*at) drop(at);
  pthread_mutex_unlock(&r->mutex);
}

static void destroy(void* state) {
  redactor* r = (redactor*)state;
  while (r->held) drop(&r->held);
  pthread_mutex_destroy(&r->mutex);
  free(r);
}

TROUPE_PLUGIN_EXPORT int troupe_plugin_init(uint32_t host_abi_major, uint32_t host_abi_minor, const char* config_json,
                                            troupe_plugin* out, troupe_reply* reply) {
  redactor* r;
  const char* key;
  (void)host_abi_minor;
  if (host_abi_major != TROUPE_PLUGIN_ABI_MAJOR) {
    reply->set_message(reply, "needs plugin ABI 1", 18);
    return 1;
  }
  r = (redactor*)calloc(1, sizeof(redactor));
  if (!r) return 1;
  pthread_mutex_init(&r->mutex, NULL);
  r->max_hold_bytes = 256;
  /* A real plugin would use a JSON parser; one numeric key is found by hand here. */
  key = config_json ? strstr(config_json, "\"max_hold_bytes\"") : NULL;
  if (key) {
    const char* colon = strchr(key, ':');
    long value = colon ? strtol(colon + 1, NULL, 10) : 0;
    if (value <= 0) {
      reply->set_message(reply, "max_hold_bytes must be a positive number", 40);
      destroy(r);
      return 1;
    }
    r->max_hold_bytes = (size_t)value;
  }
  key = config_json ? strstr(config_json, "\"word\"") : NULL;
  if (key) {
    const char* open = strchr(key + 6, '"');
    const char* close = open ? strchr(open + 1, '"') : NULL;
    size_t i, n = open && close ? (size_t)(close - open - 1) : 0;
    for (i = 0; i < n; ++i) {
      if (!is_alnum(open[1 + i])) n = 0;
    }
    if (n == 0 || n >= sizeof(r->word)) {
      reply->set_message(reply, "word must be a string of 1 to 63 letters and digits", 51);
      destroy(r);
      return 1;
    }
    memcpy(r->word, open + 1, n);
    r->word[n] = 0;
  }
  out->abi_major = TROUPE_PLUGIN_ABI_MAJOR;
  out->abi_minor = TROUPE_PLUGIN_ABI_MINOR;
  out->name = "pii-redactor";
  out->state = r;
  out->destroy = destroy;
  out->on_output = on_output;
  out->on_request_end = on_request_end;
  return 0;
}
