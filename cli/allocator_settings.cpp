// jemalloc's settings for the troupe process (read once, at its first allocation).
//
// oversize_threshold:0 keeps allocations above 8 MiB in the ordinary arenas instead of
// jemalloc's dedicated one, which gives their pages back to the kernel at once: every KV frame
// ZeroMQ receives is a fresh allocation of the frame's size (a layer of a long prompt is tens of
// MiB), and faulting in a fresh 21 MiB for each cut the KV plane to 0.3x of a plain socket copy
// on loopback; with the pages kept it runs at the copy's speed (docs/benchmarks.md, "KV transfer").
extern "C" {
const char* malloc_conf = "oversize_threshold:0";
}
