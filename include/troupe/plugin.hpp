// A header-only C++ convenience over the C plugin ABI (troupe/plugin.h): write a class with the
// hooks it implements as member functions, export it with TROUPE_PLUGIN_CLASS. The ABI stays C:
// this header compiles into the plugin, and no C++ type crosses into the host. An exception a hook
// throws becomes TROUPE_PLUGIN_ERROR with its what() as the message (failing only that request);
// one thrown by the constructor fails troupe_plugin_init with its message.
//
//   struct my_plugin {
//     explicit my_plugin(std::string_view config_json);
//     troupe_plugin_status on_request(const troupe_request& r, troupe_sampling& s, troupe::plugin_reply_ref reply);
//     troupe_plugin_status on_output(const troupe_output& o, troupe::plugin_reply_ref reply);  // optional
//     void on_request_end(int64_t request_id);                                                 // optional
//     troupe_plugin_status on_logits(const troupe_logits& row, troupe::plugin_reply_ref reply); // optional (ABI 1.1)
//     troupe_plugin_status on_route(const troupe_route_request& r, size_t& chosen,               // optional (ABI 1.2)
//                                   troupe::plugin_reply_ref reply);
//   };
//   TROUPE_PLUGIN_CLASS(my_plugin, "my-plugin")
#ifndef TROUPE_PLUGIN_HPP
#define TROUPE_PLUGIN_HPP

#include <exception>
#include <string_view>
#include <vector>

#include <troupe/plugin.h>

namespace troupe {

// What a hook hands back, copied by the host.
struct plugin_reply_ref {
  troupe_reply* c;
  void message(std::string_view text) const { c->set_message(c, text.data(), text.size()); }
  void prompt_ids(const std::vector<int32_t>& ids) const { c->set_prompt_ids(c, ids.data(), ids.size()); }
  void text(std::string_view text) const { c->set_text(c, text.data(), text.size()); }
};

namespace plugin_detail {

inline troupe_plugin_status failed(troupe_reply* reply, const char* what) {
  const std::string_view text(what ? what : "unknown exception");
  reply->set_message(reply, text.data(), text.size());
  return TROUPE_PLUGIN_ERROR;
}

template <class T>
troupe_plugin_status on_request(void* state, const troupe_request* request, troupe_sampling* sampling,
                                troupe_reply* reply) {
  try {
    return static_cast<T*>(state)->on_request(*request, *sampling, plugin_reply_ref{reply});
  } catch (const std::exception& e) {
    return failed(reply, e.what());
  } catch (...) {
    return failed(reply, nullptr);
  }
}

template <class T>
troupe_plugin_status on_output(void* state, const troupe_output* output, troupe_reply* reply) {
  try {
    return static_cast<T*>(state)->on_output(*output, plugin_reply_ref{reply});
  } catch (const std::exception& e) {
    return failed(reply, e.what());
  } catch (...) {
    return failed(reply, nullptr);
  }
}

template <class T>
troupe_plugin_status on_logits(void* state, const troupe_logits* row, troupe_reply* reply) {
  try {
    return static_cast<T*>(state)->on_logits(*row, plugin_reply_ref{reply});
  } catch (const std::exception& e) {
    return failed(reply, e.what());
  } catch (...) {
    return failed(reply, nullptr);
  }
}

template <class T>
troupe_plugin_status on_route(void* state, const troupe_route_request* request, size_t* chosen, troupe_reply* reply) {
  try {
    return static_cast<T*>(state)->on_route(*request, *chosen, plugin_reply_ref{reply});
  } catch (const std::exception& e) {
    return failed(reply, e.what());
  } catch (...) {
    return failed(reply, nullptr);
  }
}

template <class T>
void on_request_end(void* state, int64_t request_id) {
  try {
    static_cast<T*>(state)->on_request_end(request_id);
  } catch (...) {
  }
}

template <class T>
void destroy(void* state) {
  delete static_cast<T*>(state);
}

template <class T>
int init(uint32_t host_major, uint32_t host_minor, const char* config_json, troupe_plugin* out, troupe_reply* reply,
         const char* name) {
  // The host refuses a minor newer than its own; a plugin that needs more checks host_minor itself.
  (void)host_minor;
  if (host_major != TROUPE_PLUGIN_ABI_MAJOR) {
    plugin_reply_ref{reply}.message("the server's plugin ABI has another major version than this plugin's");
    return 1;
  }
  try {
    out->state = new T(std::string_view(config_json ? config_json : "{}"));
  } catch (const std::exception& e) {
    plugin_reply_ref{reply}.message(e.what());
    return 1;
  } catch (...) {
    plugin_reply_ref{reply}.message("unknown exception");
    return 1;
  }
  out->abi_major = TROUPE_PLUGIN_ABI_MAJOR;
  out->abi_minor = TROUPE_PLUGIN_ABI_MINOR;
  out->name = name;
  out->destroy = &destroy<T>;
  if constexpr (requires(T & t, const troupe_request& r, troupe_sampling& s) {
                  t.on_request(r, s, plugin_reply_ref{reply});
                }) {
    out->on_request = &plugin_detail::on_request<T>;
  }
  if constexpr (requires(T & t, const troupe_output& o) { t.on_output(o, plugin_reply_ref{reply}); }) {
    out->on_output = &plugin_detail::on_output<T>;
  }
  if constexpr (requires(T & t, const troupe_logits& l) { t.on_logits(l, plugin_reply_ref{reply}); }) {
    out->on_logits = &plugin_detail::on_logits<T>;
  }
  if constexpr (requires(T & t, const troupe_route_request& r, size_t& chosen) {
                  t.on_route(r, chosen, plugin_reply_ref{reply});
                }) {
    out->on_route = &plugin_detail::on_route<T>;
  }
  if constexpr (requires(T & t) { t.on_request_end(int64_t{0}); })
    out->on_request_end = &plugin_detail::on_request_end<T>;
  return 0;
}

}  // namespace plugin_detail
}  // namespace troupe

#define TROUPE_PLUGIN_CLASS(T, NAME)                                                                                \
  extern "C" TROUPE_PLUGIN_EXPORT int troupe_plugin_init(                                                           \
      uint32_t host_major, uint32_t host_minor, const char* config_json, troupe_plugin* out, troupe_reply* reply) { \
    return ::troupe::plugin_detail::init<T>(host_major, host_minor, config_json, out, reply, NAME);                 \
  }

#endif  // TROUPE_PLUGIN_HPP
