#include "node/cluster_credentials.hpp"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace troupe {

namespace {

namespace fs = std::filesystem;

struct openssl_free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(BIGNUM* p) const { BN_free(p); }
};
using key_ptr = std::unique_ptr<EVP_PKEY, openssl_free>;
using cert_ptr = std::unique_ptr<X509, openssl_free>;

// OpenSSL's own reason for the last failure, appended to ours.
[[noreturn]] void fail(const std::string& what) {
  const unsigned long code = ERR_get_error();
  char reason[256] = "";
  if (code != 0) ERR_error_string_n(code, reason, sizeof reason);
  ERR_clear_error();
  throw std::runtime_error(code != 0 ? what + " (" + reason + ")" : what);
}

void check(int ok, const std::string& what) {
  if (ok != 1) fail(what);
}

void check_name(std::string_view name) {
  if (name.empty() || name.size() > 64) {
    throw std::runtime_error("a member name must be 1 to 64 characters, got '" + std::string(name) + "'");
  }
  for (char c : name) {
    const bool allowed =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!allowed) {
      throw std::runtime_error("a member name may hold only letters, digits, '.', '_' and '-', got '" +
                               std::string(name) + "'");
    }
  }
  if (name == "ca") throw std::runtime_error("'ca' names the certificate authority, not a member");
}

// EC P-256: small keys, fast handshakes, supported by every TLS 1.2/1.3 peer.
key_ptr new_key() {
  key_ptr key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (!key) fail("cannot generate an EC P-256 key");
  return key;
}

void add_extension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (!ext) fail(std::string("cannot make the certificate extension ") + value);
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  check(ok, "cannot add a certificate extension");
}

cert_ptr new_certificate(EVP_PKEY* key, std::string_view common_name, int valid_days) {
  if (valid_days < 1 || valid_days > 36500) {
    throw std::runtime_error("validity must be 1 to 36500 days, got " + std::to_string(valid_days));
  }
  cert_ptr cert(X509_new());
  if (!cert) fail("cannot allocate a certificate");
  check(X509_set_version(cert.get(), 2), "cannot set the certificate version");  // X.509 v3
  // A random 127-bit serial: unique per issue without a serial file to keep.
  unsigned char serial_bytes[16];
  check(RAND_bytes(serial_bytes, sizeof serial_bytes), "no random bytes for a serial number");
  serial_bytes[0] &= 0x7f;
  std::unique_ptr<BIGNUM, openssl_free> serial(BN_bin2bn(serial_bytes, sizeof serial_bytes, nullptr));
  if (!serial || !BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())))
    fail("cannot set a serial number");
  // Valid from an hour ago: clocks of the cluster's machines may differ a little.
  if (!X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) ||
      !X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(valid_days) * 86400)) {
    fail("cannot set the validity period");
  }
  X509_NAME* subject = X509_get_subject_name(cert.get());
  check(X509_NAME_add_entry_by_txt(subject, "O", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>("troupe"), -1,
                                   -1, 0),
        "cannot set the subject");
  check(X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_UTF8,
                                   reinterpret_cast<const unsigned char*>(std::string(common_name).c_str()), -1, -1, 0),
        "cannot set the subject");
  check(X509_set_pubkey(cert.get(), key), "cannot set the public key");
  return cert;
}

void write_file(const fs::path& path, const std::string& pem, bool secret) {
  // Private keys are readable by their owner only, from the moment they exist.
  const mode_t old_mask = umask(secret ? 077 : 022);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  umask(old_mask);
  if (!out) throw std::runtime_error("cannot write " + path.string());
  out << pem;
  if (!out.flush()) throw std::runtime_error("cannot write " + path.string());
  if (secret) fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
}

std::string to_pem(X509* cert) {
  std::unique_ptr<BIO, openssl_free> bio(BIO_new(BIO_s_mem()));
  check(PEM_write_bio_X509(bio.get(), cert), "cannot encode a certificate");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

std::string to_pem(EVP_PKEY* key) {
  std::unique_ptr<BIO, openssl_free> bio(BIO_new(BIO_s_mem()));
  check(PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr), "cannot encode a key");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

cert_ptr read_certificate(const fs::path& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw std::runtime_error("cannot open " + path.string());
  cert_ptr cert(PEM_read_X509(file.get(), nullptr, nullptr, nullptr));
  if (!cert) fail(path.string() + " is not a PEM certificate");
  return cert;
}

key_ptr read_key(const fs::path& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw std::runtime_error("cannot open " + path.string());
  key_ptr key(PEM_read_PrivateKey(file.get(), nullptr, nullptr, nullptr));
  if (!key) fail(path.string() + " is not a PEM private key (or is protected by a passphrase)");
  return key;
}

}  // namespace

member_credentials credentials_in(const fs::path& dir, std::string_view name) {
  return {dir / (std::string(name) + ".crt"), dir / (std::string(name) + ".key"), dir / "ca.crt"};
}

void make_cluster_ca(const fs::path& dir, std::string_view cluster_name, int valid_days) {
  check_name(cluster_name == "ca" ? "x" : cluster_name);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create " + dir.string() + ": " + ec.message());
  if (fs::exists(dir / "ca.crt") || fs::exists(dir / "ca.key")) {
    throw std::runtime_error(dir.string() +
                             " already holds a CA (ca.crt/ca.key); every certificate it issued "
                             "would stop working if it were replaced. Use another directory.");
  }
  key_ptr key = new_key();
  cert_ptr cert = new_certificate(key.get(), std::string(cluster_name) + " CA", valid_days);
  check(X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get())), "cannot set the issuer");
  add_extension(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
  add_extension(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
  add_extension(cert.get(), cert.get(), NID_subject_key_identifier, "hash");
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) <= 0) fail("cannot sign the CA certificate");
  write_file(dir / "ca.key", to_pem(key.get()), true);
  write_file(dir / "ca.crt", to_pem(cert.get()), false);
}

member_credentials issue_member_certificate(const fs::path& dir, std::string_view name, int valid_days, bool replace) {
  check_name(name);
  const member_credentials files = credentials_in(dir, name);
  if (!replace && (fs::exists(files.certificate) || fs::exists(files.private_key))) {
    throw std::runtime_error(files.certificate.string() + " already exists (pass --replace to issue it anew)");
  }
  if (!fs::exists(dir / "ca.key")) {
    throw std::runtime_error("no CA key at " + (dir / "ca.key").string() + ": make the CA first (troupe certs --out " +
                             dir.string() + ")");
  }
  cert_ptr ca = read_certificate(dir / "ca.crt");
  key_ptr ca_key = read_key(dir / "ca.key");
  if (X509_check_private_key(ca.get(), ca_key.get()) != 1) {
    ERR_clear_error();
    throw std::runtime_error((dir / "ca.key").string() + " does not belong to " + (dir / "ca.crt").string());
  }
  key_ptr key = new_key();
  cert_ptr cert = new_certificate(key.get(), name, valid_days);
  check(X509_set_issuer_name(cert.get(), X509_get_subject_name(ca.get())), "cannot set the issuer");
  add_extension(cert.get(), ca.get(), NID_basic_constraints, "critical,CA:FALSE");
  add_extension(cert.get(), ca.get(), NID_key_usage, "critical,digitalSignature,keyAgreement");
  // Every member both accepts connections and makes them.
  add_extension(cert.get(), ca.get(), NID_ext_key_usage, "serverAuth,clientAuth");
  add_extension(cert.get(), ca.get(), NID_authority_key_identifier, "keyid:always");
  if (X509_sign(cert.get(), ca_key.get(), EVP_sha256()) <= 0)
    fail("cannot sign the certificate of " + std::string(name));
  write_file(files.private_key, to_pem(key.get()), true);
  write_file(files.certificate, to_pem(cert.get()), false);
  return files;
}

void verify_member_credentials(const member_credentials& files) {
  cert_ptr cert = read_certificate(files.certificate);
  cert_ptr ca = read_certificate(files.ca_certificate);
  key_ptr key = read_key(files.private_key);
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    throw std::runtime_error(files.private_key.string() + " does not belong to " + files.certificate.string());
  }
  std::unique_ptr<X509_STORE, openssl_free> store(X509_STORE_new());
  std::unique_ptr<X509_STORE_CTX, openssl_free> ctx(X509_STORE_CTX_new());
  if (!store || !ctx) fail("cannot allocate a certificate store");
  check(X509_STORE_add_cert(store.get(), ca.get()), "cannot trust " + files.ca_certificate.string());
  check(X509_STORE_CTX_init(ctx.get(), store.get(), cert.get(), nullptr), "cannot verify a certificate");
  X509_STORE_CTX_set_purpose(ctx.get(), X509_PURPOSE_SSL_CLIENT);
  if (X509_verify_cert(ctx.get()) != 1) {
    const int error = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    throw std::runtime_error(files.certificate.string() + " is not accepted by " + files.ca_certificate.string() +
                             ": " + X509_verify_cert_error_string(error));
  }
}

std::string certificate_common_name(const fs::path& certificate) {
  cert_ptr cert = read_certificate(certificate);
  char name[256] = "";
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert.get()), NID_commonName, name, sizeof name) < 0) return "";
  return name;
}

}  // namespace troupe
