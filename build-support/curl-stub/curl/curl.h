/*
 * Intentionally empty. librdkafka 2.12 (built by rdkafka-sys with
 * cmake-build, without curl) includes <curl/curl.h> in rdkafka_conf.c under
 * `#ifdef WITH_OAUTHBEARER_OIDC`, and its generated config.h defines that
 * macro as 0, so the header is included although nothing of it is used.
 * This stub lets vcdn build on a machine without libcurl's development
 * headers (see .cargo/config.toml). With curl support on, a real curl.h
 * would be needed and this stub would not do.
 */
