// Generates the differential vectors of tests/contracts/test_semver.py and
// tests/contracts/test_placement_decision.py (committed beside this file; CI only reads them).
//
//   mkdir -p /tmp/semver && (cd /tmp/semver && npm install semver@7.7.4)
//   NODE_PATH=/tmp/semver/node_modules node tests/contracts/vectors/generate.mjs tests/contracts/vectors
//
// How the expected values are derived:
// * semver.jsonl: every case's `valid`, `validRange` and `satisfies` (with and without
//   includePrerelease) come from the npm package `semver` 7.7.4 itself, the version the
//   reference's ql3-runtime-core pins (package.json "semver": "7.7.4"); the inputs are
//   generated from a seeded PRNG over the grammar's corners (x-ranges, carets, tildes,
//   hyphens, ||, prereleases, build metadata, 'v'/'=' prefixes, white space, numbers at
//   and past 2^53-1, malformed pieces).
// * placement.jsonl: each case is (worker session row, capabilities, placement) and the
//   decision {matches, score, mismatches} of the reference's evaluateRemoteWorkerPlacement
//   (packages/ql3-runtime-core/src/remote-execution/remoteWorkerPlacement.ts at 6265e31,
//   with remoteWorkerCompatibility.ts): `oracle()` below restates its rules in their order
//   (worker_unavailable, support_tier with the tier1 default, protocol_version against
//   ">=1.0.0 <2.0.0" and the placement's range, architecture, operating_system, executor
//   with the remote-worker default, runtime by name and versionRange, label, memory, disk,
//   gpu, feature; score = the weights of the preferences whose labels all match), with
//   every semver question asked of the real package (satisfies with includePrerelease,
//   validRange for the normalization; an invalid range makes the placement invalid, as
//   the reference's normalizer throws). The reference's code is not copied here.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const semver = require('semver');
if (semver.SEMVER_SPEC_VERSION !== '2.0.0' || require('semver/package.json').version !== '7.7.4') {
  throw new Error('semver 7.7.4 is required');
}
const out = process.argv[2] || '.';

let seed = 0x5eed2025;
function rand() { // mulberry32
  seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (items) => items[Math.floor(rand() * items.length)];
const chance = (p) => rand() < p;
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));

// ---- semver -------------------------------------------------------------------------------
const NUMS = ['0', '1', '2', '3', '10', '0', '1', '2', '9007199254740991', '9007199254740992', '01', '99'];
const PRE = ['alpha', 'beta', 'rc', '0', '1', '2', '10', 'alpha.1', 'beta.2', 'rc.1', '0a', 'x-y', '-',
  '01', '9007199254740991', '99999999999999999999', 'alpha-1', 'A'];
const BUILD = ['build', '001', 'sha.5114f85', 'x'];
function num() { return chance(0.85) ? pick(['0', '1', '2', '3', '4', '10']) : pick(NUMS); }
function version(loose = false) {
  let text = `${num()}.${num()}.${num()}`;
  if (chance(0.35)) text += '-' + pick(PRE);
  if (chance(0.1)) text += '+' + pick(BUILD);
  if (chance(0.08)) text = 'v' + text;
  if (loose && chance(0.05)) text = pick([' ', '  ', '\u00a0', '\t']) + text + pick(['', ' ']);
  if (loose && chance(0.04)) text = pick(['1.2', '1', 'x', '1.2.3.4', '=1.2.3', 'v 1.2.3', '', '1.2.3-', '1.2.3+']);
  return text;
}
function xpart() { return chance(0.25) ? pick(['x', 'X', '*']) : num(); }
function partial() {
  const depth = int(1, 3);
  let text = xpart();
  if (depth >= 2) text += '.' + xpart();
  if (depth >= 3) text += '.' + xpart();
  if (depth === 3 && chance(0.3)) text += '-' + pick(PRE);
  if (depth === 3 && chance(0.08)) text += '+' + pick(BUILD);
  if (chance(0.06)) text = pick(['v', '=', 'v=', ' ']) + text;
  return text;
}
function comparator() {
  const shape = rand();
  if (shape < 0.3) return pick(['', '>', '>=', '<', '<=', '=', '']) + pick(['', '', ' ']) + partial();
  if (shape < 0.45) return '^' + pick(['', '', ' ']) + partial();
  if (shape < 0.6) return pick(['~', '~>', '~']) + pick(['', '', ' ']) + partial();
  if (shape < 0.72) return partial() + ' - ' + partial();
  if (shape < 0.8) return pick(['*', 'x', '', '>=0.0.0', '>=0.0.0-0', '<0.0.0-0', '>*', '<x']);
  if (shape < 0.85) return pick(['>', '<=', '~', '^', '-', '1.2.3 -', '>= ', '>>1', '1.2.3||', '||', 'a.b.c',
    '1.2.3-rc 2', '>=1.2.3 <=', '1.2.3 - 2.3.4 - 5', '>=1 <2 || >=3', ' 1.2.3 ', '1.2.3\u00a0-\u00a02']);
  return pick(['>=', '<', '']) + version();
}
function range() {
  const sets = [];
  for (let s = int(1, chance(0.3) ? 3 : 1); s > 0; s--) {
    const parts = [];
    for (let c = int(1, 3); c > 0; c--) parts.push(comparator());
    sets.push(parts.join(pick([' ', ' ', '  '])));
  }
  return sets.join(pick(['||', ' || ', ' ||']));
}

const semverCases = [];
const seen = new Set();
while (semverCases.length < 1600) {
  const v = version(true);
  const r = range();
  const key = `${v}\u0000${r}`;
  if (seen.has(key)) continue;
  seen.add(key);
  semverCases.push({
    version: v, range: r, valid: semver.valid(v), validRange: semver.validRange(r),
    validRangePre: semver.validRange(r, { includePrerelease: true }),
    satisfies: semver.satisfies(v, r), satisfiesPre: semver.satisfies(v, r, { includePrerelease: true }),
  });
}

// ---- placement ------------------------------------------------------------------------------
const TIERS = { tier1: ['amd64', 'arm64'], candidate: ['ppc64le', 's390x'], experimental: ['arm/v7'],
  'legacy-only': ['arm/v6', '386'] };
const TIER_NAMES = Object.keys(TIERS);
const ARCHS = TIER_NAMES.flatMap((t) => TIERS[t]);
const tierOf = (arch) => TIER_NAMES.find((t) => TIERS[t].includes(arch));
const LABEL_KEYS = ['site', 'zone', 'rack', 'gpu', 'owner/team', 'a.b', 'Z9'];
const LABEL_VALUES = ['lab', 'edge', 'r1', 'yes', 'ops', '上海', 'x'];
const RUNTIMES = ['python', 'node', 'bun', 'deno'];
const FEATURES = ['cgroups', 'ipv6', 'tmpfs', 'namespaces'];
const GPUS = ['nvidia', 'amd', 'intel'];
const OSES = ['linux', 'freebsd', 'darwin'];
const RUNTIME_VERSIONS = ['3.11.2', '3.13.0-rc.1', '3.12.0', '20.11.1', '18.0.0', 'v22.1.0', '1.0.0-beta.2',
  '0.5.1', '3.9.18', '2.0.0', '1.2.3-alpha.10', '1.2.3-alpha.9'];
const RUNTIME_RANGES = ['>=3.11', '^3.12.0', '~3.11.0', '3.x', '>=20 <21', '*', '>=3.13.0-rc.0', '<3.13',
  '1.2.3-alpha.9 - 1.2.3-alpha.10', '^0.5.0', '>=1.0.0-beta <1.0.0', '18 || 20', '', '>=3.11.2', '=3.11.2',
  'not-a-range', '>=x.y', '~>3.12', '^1.x', '<=2.0.0', '>2.0.0-0', '3.11.2 - 3.12.x'];
const PROTOCOLS = ['1.0.0', '1.2.0', '1.0.0-beta.1', '2.0.0', '1.9.9', '0.9.0'];
const PROTOCOL_RANGES = ['>=1.0.0', '^1.0.0', '>=1.1.0 <2.0.0', '1.x', '>=1.0.0-0', '~1.0.0', '>=2', '*', '1.0.0',
  'bogus', '<1.0.0 || >=1.2.0'];

function sample(items, max) {
  const count = int(0, Math.min(max, items.length));
  const pool = [...items];
  const result = [];
  for (let i = 0; i < count; i++) result.push(pool.splice(Math.floor(rand() * pool.length), 1)[0]);
  return result;
}
function labels(max) {
  const out = {};
  for (const key of sample(LABEL_KEYS, max)) out[key] = pick(LABEL_VALUES);
  return out;
}
function capabilities() {
  const arch = chance(0.7) ? pick(TIERS.tier1) : pick(ARCHS);
  const caps = { architecture: arch, executors: chance(0.9) ? ['remote-worker', ...sample(['shell', 'docker'], 1)]
    : sample(['shell', 'docker'], 2).concat(['shell']).filter((v, i, a) => a.indexOf(v) === i),
  protocolVersion: chance(0.8) ? '1.0.0' : pick(PROTOCOLS), supportTier: tierOf(arch) };
  if (chance(0.7)) caps.operatingSystem = chance(0.7) ? 'linux' : pick(OSES);
  if (chance(0.7)) {
    caps.runtimes = sample(RUNTIMES, 3).map((name) => ({ name, version: pick(RUNTIME_VERSIONS) }));
  }
  if (chance(0.7)) caps.labels = labels(4);
  if (chance(0.7)) {
    caps.capacity = {};
    if (chance(0.8)) caps.capacity.cpuCores = int(1, 8);
    if (chance(0.8)) caps.capacity.memoryBytes = pick([134217728, 536870912, 1073741824, 8589934592]);
    if (chance(0.8)) caps.capacity.diskBytes = pick([16777216, 1073741824, 34359738368]);
    if (chance(0.3)) caps.capacity.gpu = sample(GPUS, 2).map((vendor) => ({ vendor }));
  }
  if (chance(0.5)) caps.features = sample(FEATURES, 3);
  return caps;
}
// Each requirement is drawn either from what the capabilities have (so a good share of the
// cases match) or at random (so every mismatch kind occurs).
function placement(caps) {
  const p = {};
  const own = (chosen, anything) => (chance(0.6) ? chosen() : anything());
  if (chance(0.85)) {
    const r = {};
    if (chance(0.2)) r.architectures = own(() => [caps.architecture, ...sample(ARCHS.filter((a) => a !== caps.architecture), 1)], () => sample(ARCHS, 3));
    if (chance(0.2)) r.operatingSystems = own(() => (caps.operatingSystem ? [caps.operatingSystem] : []), () => sample(OSES, 2));
    if (chance(0.2)) r.executors = chance(0.85) ? ['remote-worker', ...sample(['shell'], 1)] : ['remote-worker'];
    if (chance(0.15)) r.protocolVersionRange = pick(PROTOCOL_RANGES);
    if (chance(0.35)) {
      const names = own(() => (caps.runtimes ?? []).map((x) => x.name).slice(0, 2), () => sample(RUNTIMES, 2));
      r.runtimes = names.map((name) => (chance(0.75) ? { name, versionRange: pick(RUNTIME_RANGES) } : { name }));
    }
    if (chance(0.3)) r.supportTiers = own(() => [caps.supportTier, ...sample(TIER_NAMES.filter((t) => t !== caps.supportTier), 1)], () => sample(TIER_NAMES, 3));
    if (chance(0.3)) {
      r.labels = own(() => Object.fromEntries(Object.entries(caps.labels ?? {}).slice(0, 2)), () => labels(2));
    }
    const mem = caps.capacity?.memoryBytes; const disk = caps.capacity?.diskBytes;
    if (chance(0.25)) r.minMemoryBytes = own(() => (mem ? pick([mem, Math.floor(mem / 2), 1]) : 1), () => pick([1, 134217728, 268435456, 1073741824, 17179869184]));
    if (chance(0.25)) r.minDiskBytes = own(() => (disk ? pick([disk, disk + 1, 1]) : 1), () => pick([1, 16777216, 2147483648, 68719476736]));
    if (chance(0.12)) r.gpuVendor = own(() => caps.capacity?.gpu?.[0]?.vendor ?? 'nvidia', () => pick(GPUS));
    if (chance(0.2)) r.features = own(() => (caps.features ?? []).slice(0, 2), () => sample(FEATURES, 2));
    p.required = r;
  }
  if (chance(0.4)) {
    p.preferred = [];
    for (let i = int(1, 3); i > 0; i--) {
      let l = own(() => Object.fromEntries(Object.entries(caps.labels ?? {}).slice(0, int(1, 2))), () => labels(2));
      if (Object.keys(l).length === 0) l = { site: 'lab' };
      p.preferred.push({ labels: l, weight: int(1, 100) });
    }
  }
  return p;
}
function worker() {
  const now = 1_700_000_000_000;
  const roll = rand();
  return {
    status: roll < 0.95 ? 'online' : pick(['draining', 'offline']),
    availableSlots: chance(0.95) ? int(1, 4) : 0,
    leaseExpiresAtMs: chance(0.95) ? now + 45_000 : pick([now, now - 1]),
    observedAtMs: now,
  };
}

const containsLabels = (actual, expected) => Object.entries(expected).every(([k, v]) =>
  actual !== undefined && Object.hasOwn(actual, k) && actual[k] === v);
const validRangeText = (value) => typeof value === 'string' && value.length >= 1 && value.length <= 128 &&
  !/[\u0000-\u001f\u007f]/.test(value) && semver.validRange(value) !== null;

function oracle(session, caps, spec) {
  const required = { ...(spec.required ?? {}) };
  if (required.protocolVersionRange !== undefined && !validRangeText(required.protocolVersionRange)) {
    return { error: 'placement' };
  }
  for (const runtime of required.runtimes ?? []) {
    if (runtime.versionRange !== undefined && !validRangeText(runtime.versionRange)) return { error: 'placement' };
  }
  if (required.executors !== undefined && !required.executors.includes('remote-worker')) {
    return { error: 'placement' };
  }
  required.executors ??= ['remote-worker'];
  const mismatches = [];
  if (session.status !== 'online' || session.availableSlots < 1 || session.leaseExpiresAtMs <= session.observedAtMs) {
    mismatches.push('worker_unavailable');
  }
  if (!(required.supportTiers ?? ['tier1']).includes(caps.supportTier)) mismatches.push('support_tier');
  const compatible = (range) => semver.satisfies(caps.protocolVersion, range, { includePrerelease: true });
  if (!compatible('>=1.0.0 <2.0.0') || (required.protocolVersionRange !== undefined &&
      !compatible(required.protocolVersionRange))) mismatches.push('protocol_version');
  if (required.architectures?.length && !required.architectures.includes(caps.architecture)) {
    mismatches.push('architecture');
  }
  if (required.operatingSystems?.length && (!caps.operatingSystem ||
      !required.operatingSystems.includes(caps.operatingSystem))) mismatches.push('operating_system');
  if (required.executors.some((e) => !caps.executors.includes(e))) mismatches.push('executor');
  if ((required.runtimes ?? []).some((need) => !(caps.runtimes ?? []).some((have) => have.name === need.name &&
      (need.versionRange === undefined || semver.satisfies(have.version, need.versionRange,
        { includePrerelease: true }))))) mismatches.push('runtime');
  if (required.labels && !containsLabels(caps.labels, required.labels)) mismatches.push('label');
  if (required.minMemoryBytes !== undefined && (caps.capacity?.memoryBytes ?? 0) < required.minMemoryBytes) {
    mismatches.push('memory');
  }
  if (required.minDiskBytes !== undefined && (caps.capacity?.diskBytes ?? 0) < required.minDiskBytes) {
    mismatches.push('disk');
  }
  if (required.gpuVendor !== undefined && !(caps.capacity?.gpu ?? []).some((g) => g.vendor === required.gpuVendor)) {
    mismatches.push('gpu');
  }
  if ((required.features ?? []).some((f) => !(caps.features ?? []).includes(f))) mismatches.push('feature');
  const score = (spec.preferred ?? []).reduce((sum, p) => sum + (containsLabels(caps.labels, p.labels)
    ? p.weight : 0), 0);
  return { matches: mismatches.length === 0, score, mismatches };
}

const placementCases = [];
while (placementCases.length < 500) {
  const session = worker();
  const caps = capabilities();
  if (!caps.executors.length) continue;
  const spec = placement(caps);
  placementCases.push({ worker: session, capabilities: caps, placement: spec,
    expected: oracle(session, caps, spec) });
}

const lines = (cases) => cases.map((c) => JSON.stringify(c)).join('\n') + '\n';
fs.writeFileSync(path.join(out, 'semver.jsonl'), lines(semverCases));
fs.writeFileSync(path.join(out, 'placement.jsonl'), lines(placementCases));
const matched = placementCases.filter((c) => c.expected.matches).length;
console.log(`semver: ${semverCases.length} cases; placement: ${placementCases.length} cases, ${matched} matching`);
