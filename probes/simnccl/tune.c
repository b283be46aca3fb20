/* tune.c - NCCL_PROTO / NCCL_ALGO (re-read at every comm init, src/graph/tuning.cc) and the
 * simulated choice of algorithm, protocol and channels per collective.
 *
 * Syntax (parseList, 2.24+): "LL,Simple", "^LL128", "allreduce:tree", "ring;allreduce:^LL" - the
 * first list may lack a function prefix and applies to all functions; names are case-insensitive.
 * The simulated machine is one node of PCIe GPUs: Ring and Tree exist, CollNet/NVLS do not, PAT only
 * for AllGather/ReduceScatter; LL128 is off unless NCCL_PROTO enables it by name (NCCL disables it
 * on PCIe). Default model: LL below 64 KiB, LL128 (when enabled) below 4 MiB, Simple above; Ring.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sim.h"

const char* simFuncStr[SIM_NUM_FUNCS] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"};
const char* simAlgoStr[SIM_NUM_ALGOS] = {"Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"};
const char* simProtoStr[SIM_NUM_PROTOS] = {"LL", "LL128", "Simple"};

/* TUNING lines and profiler descriptors print these (ncclAlgoToString, src/collectives.cc) */
const char* simAlgoToString(int algo) {
  static const char* s[SIM_NUM_ALGOS] = {"TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE",
                                         "PAT"};
  return (algo >= 0 && algo < SIM_NUM_ALGOS) ? s[algo] : "Unknown";
}

const char* simProtoToString(int proto) {
  static const char* s[SIM_NUM_PROTOS] = {"LL", "LL128", "SIMPLE"};
  return (proto >= 0 && proto < SIM_NUM_PROTOS) ? s[proto] : "Unknown";
}

/* list is [SIM_NUM_FUNCS][nelems]; entries named by str become 1 (or 0 with ^), the rest of a
 * mentioned function 0 (or 1 with ^). Returns ncclInvalidUsage with a WARN, as NCCL does. */
ncclResult_t simParseList(const char* str, int nelems, const char* const elems[], int* list) {
  ncclResult_t ret = ncclSuccess;
  char* full = strdup(str);
  if (!full) return ncclSystemError;
  char* saveFull = NULL;
  int first = 1;
  for (char* tok = strtok_r(full, ";", &saveFull); tok; tok = strtok_r(NULL, ";", &saveFull), first = 0) {
    char* colon = strchr(tok, ':');
    const char* prefix = NULL;
    char* elemList = tok;
    if (colon) {
      *colon = '\0';
      prefix = tok;
      elemList = colon + 1;
    } else if (!first) {
      WARN("All entries except the first must have a prefix: \"%s\"", str);
      ret = ncclInvalidUsage;
      break;
    }
    int set = 1;
    if (elemList[0] == '^') { set = 0; elemList++; }
    int found = 0;
    for (int f = 0; f < SIM_NUM_FUNCS && ret == ncclSuccess; f++) {
      if (prefix && strcasecmp(prefix, simFuncStr[f]) != 0) continue;
      found = 1;
      for (int e = 0; e < nelems; e++) list[f * nelems + e] = !set;
      char* elems_ = strdup(elemList);
      if (!elems_) { ret = ncclSystemError; break; }
      char* saveElem = NULL;
      for (char* el = strtok_r(elems_, ",", &saveElem); el; el = strtok_r(NULL, ",", &saveElem)) {
        int e = 0;
        while (e < nelems && strcasecmp(el, elems[e]) != 0) e++;
        if (e == nelems) {
          WARN("Unrecognized element token \"%s\" when parsing \"%s\"", el, str);
          ret = ncclInvalidUsage;
          break;
        }
        list[f * nelems + e] = set;
      }
      free(elems_);
    }
    if (ret != ncclSuccess) break;
    if (!found) {
      WARN("Unrecognized prefix token \"%s\" when parsing \"%s\"", prefix, str);
      ret = ncclInvalidUsage;
      break;
    }
  }
  free(full);
  return ret;
}

ncclResult_t simTuneComm(simTuning* t) {
  for (int f = 0; f < SIM_NUM_FUNCS; f++) {
    for (int a = 0; a < SIM_NUM_ALGOS; a++) t->algo[f][a] = -1;
    for (int p = 0; p < SIM_NUM_PROTOS; p++) t->proto[f][p] = -1;
  }
  /* re-read at every comm init through ncclGetEnv: a change between two comms takes effect */
  const char* protoStr = simGetEnv("NCCL_PROTO");
  const char* algoStr = simGetEnv("NCCL_ALGO");
  snprintf(t->protoStr, sizeof(t->protoStr), "%s", protoStr ? protoStr : "");
  snprintf(t->algoStr, sizeof(t->algoStr), "%s", algoStr ? algoStr : "");
  if (protoStr) {
    INFO(SIM_ENV, "NCCL_PROTO set by environment to %s", protoStr);
    ncclResult_t r = simParseList(protoStr, SIM_NUM_PROTOS, simProtoStr, &t->proto[0][0]);
    if (r != ncclSuccess) return r;
  }
  if (algoStr) {
    INFO(SIM_ENV, "NCCL_ALGO set by environment to %s", algoStr);
    ncclResult_t r = simParseList(algoStr, SIM_NUM_ALGOS, simAlgoStr, &t->algo[0][0]);
    if (r != ncclSuccess) return r;
  }
  return ncclSuccess;
}

static int algoAvailable(int func, int a) {
  if (a == SIM_ALGO_RING) return 1;
  if (a == SIM_ALGO_TREE) return func == SIM_FUNC_ALLREDUCE; /* NCCL's tree is AllReduce-only */
  if (a == SIM_ALGO_PAT) return func == SIM_FUNC_ALLGATHER || func == SIM_FUNC_REDUCESCATTER;
  return 0; /* no CollNet network, no NVSwitch in the simulated machine */
}

ncclResult_t simPick(const simTuning* t, int func, size_t nbytes, int* algo, int* proto) {
  /* protocols: a user's explicit 1 enables, 0 disables; unset follows the model (LL128 off) */
  int protoOk[SIM_NUM_PROTOS];
  for (int p = 0; p < SIM_NUM_PROTOS; p++) {
    int u = t->proto[func][p];
    protoOk[p] = u >= 0 ? u : (p != SIM_PROTO_LL128);
  }
  static const int small[] = {SIM_PROTO_LL, SIM_PROTO_LL128, SIM_PROTO_SIMPLE};
  static const int medium[] = {SIM_PROTO_LL128, SIM_PROTO_SIMPLE, SIM_PROTO_LL};
  static const int large[] = {SIM_PROTO_SIMPLE, SIM_PROTO_LL128, SIM_PROTO_LL};
  const int* order = nbytes < (64u << 10) ? small : nbytes < (4u << 20) ? medium : large;
  *proto = -1;
  for (int i = 0; i < SIM_NUM_PROTOS && *proto < 0; i++)
    if (protoOk[order[i]]) *proto = order[i];
  static const int algoOrder[] = {SIM_ALGO_RING, SIM_ALGO_TREE, SIM_ALGO_PAT};
  *algo = -1;
  for (int i = 0; i < 3 && *algo < 0; i++) {
    int a = algoOrder[i];
    if (t->algo[func][a] != 0 && algoAvailable(func, a)) *algo = a;
  }
  if (*algo < 0 || *proto < 0) {
    WARN("Error : no algorithm/protocol available for function %s with datatype %s. NCCL_ALGO was set to %s and "
         "NCCL_PROTO was set to %s.", simFuncStr[func], "simulated", t->algoStr[0] ? t->algoStr : "(unset)",
         t->protoStr[0] ? t->protoStr : "(unset)");
    return ncclInternalError;
  }
  return ncclSuccess;
}
