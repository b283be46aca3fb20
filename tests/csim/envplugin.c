/* Test env plugin (ncclEnvPlugin_v1): logs init and every lookup to $SIMTEST_ENV_LOG and answers
 * $SIMTEST_ENV_OVERRIDE ("NAME=VALUE") itself; everything else comes from getenv. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../probes/include/nccl_abi.h"

static FILE* out;
static char overrideName[128], overrideValue[256];

static ncclResult_t init(uint8_t major, uint8_t minor, uint8_t patch, const char* suffix) {
  const char* path = getenv("SIMTEST_ENV_LOG");
  out = path ? fopen(path, "a") : NULL;
  if (out) { setvbuf(out, NULL, _IOLBF, 0); fprintf(out, "init %d.%d.%d %s\n", major, minor, patch, suffix ? suffix : "(null)"); }
  const char* ov = getenv("SIMTEST_ENV_OVERRIDE");
  const char* eq = ov ? strchr(ov, '=') : NULL;
  if (eq) {
    snprintf(overrideName, sizeof(overrideName), "%.*s", (int)(eq - ov), ov);
    snprintf(overrideValue, sizeof(overrideValue), "%s", eq + 1);
  }
  return ncclSuccess;
}

static ncclResult_t finalize(void) {
  if (out) { fprintf(out, "finalize\n"); fclose(out); out = NULL; }
  return ncclSuccess;
}

static const char* getEnv(const char* name) {
  if (out) fprintf(out, "get %s\n", name);
  if (overrideName[0] && strcmp(name, overrideName) == 0) return overrideValue;
  return getenv(name);
}

__attribute__((visibility("default"))) ncclEnv_v1_t ncclEnvPlugin_v1 = {"simtest-env", init, finalize, getEnv};
