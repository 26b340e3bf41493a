#!/usr/bin/env node
// Validates a rendered multi-document YAML (`kubectl kustomize DIR`) offline:
// every object against the OpenAPI schema of its kind (kubernetes-models,
// plus cert-manager's CRDs), then strata's own rules. One line per problem,
// "Kind/name: field: problem"; exit 1 on any problem, 2 on bad usage.
//
//   kubectl kustomize deploy/k8s/overlays/cpu | node deploy/k8s/validate/validate.mjs
//   node deploy/k8s/validate/validate.mjs rendered.yaml ...
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";
import * as kubernetesModels from "kubernetes-models";
import * as certManagerModels from "@kubernetes-models/cert-manager";

// Secrets the operator creates by hand before the first apply (commands in
// docs/OPERATIONS.md), with the keys strata's manifests read from them.
// Anything else a pod references must be in the render.
const USER_SECRETS = {
  "strata-token": ["token"],
  "strata-redis": ["password"],
  "strata-coordinator-tls": ["tls.crt", "tls.key", "ca.crt"],
  "strata-worker-tls": ["tls.crt", "tls.key", "ca.crt"],
};

// ---------------------------------------------------------------- models

const models = new Map(); // "apiVersion/Kind" -> model class
(function index(ns, depth) {
  for (const value of Object.values(ns)) {
    if (typeof value === "function" && value.apiVersion && value.kind) {
      models.set(`${value.apiVersion}/${value.kind}`, value);
    } else if (value && typeof value === "object" && depth < 3) {
      index(value, depth + 1);
    }
  }
})({ kubernetesModels, certManagerModels }, 0);

const groupOf = (apiVersion) => (apiVersion.includes("/") ? apiVersion.slice(0, apiVersion.lastIndexOf("/")) : "");
const isGa = (apiVersion) => /^v\d+$/.test(apiVersion.slice(apiVersion.lastIndexOf("/") + 1));

// A GA version of the same kind, when `apiVersion` is a beta or alpha one:
// those are gone from current clusters (or will be).
function gaVersionOf(apiVersion, kind) {
  if (isGa(apiVersion)) return null;
  for (const key of models.keys()) {
    const [, v, k] = key.match(/^(.*)\/([^/]+)$/) ?? [];
    if (k === kind && groupOf(v) === groupOf(apiVersion) && isGa(v)) return v;
  }
  return null;
}

// Runs a model's schema validator over a copy of `data` whose objects record
// which properties the validator reads. A property it never reads is not in
// the schema: the generated schemas let unknown fields through, where the
// API server refuses them (or, with lax clients, drops a misspelled
// `readinesProbe` silently). Maps the schema iterates (labels,
// resources.limits, ...) count as fully read.
function validateSchema(Model, data) {
  const records = [];
  const track = (value, path) => {
    if (Array.isArray(value)) return value.map((v, i) => track(v, `${path}[${elementName(v, i)}]`));
    if (value === null || typeof value !== "object") return value;
    const record = { path, keys: Object.keys(value), read: new Set(), iterated: false };
    records.push(record);
    const copy = {};
    for (const [k, v] of Object.entries(value)) copy[k] = track(v, path ? `${path}.${k}` : k);
    return new Proxy(copy, {
      get(target, key, receiver) {
        if (typeof key === "string") record.read.add(key);
        return Reflect.get(target, key, receiver);
      },
      has(target, key) {
        if (typeof key === "string") record.read.add(key);
        return Reflect.has(target, key);
      },
      ownKeys(target) {
        record.iterated = true;
        return Reflect.ownKeys(target);
      },
    });
  };
  const problems = [];
  try {
    Model.prototype.validate.call(track(data, ""));
  } catch (e) {
    for (const err of e.errors ?? [{ instancePath: "", message: e.message }]) {
      const field = fieldPath(data, err.instancePath);
      let message = err.message;
      if (err.params?.allowedValues) message += ` (${err.params.allowedValues.join(", ")})`;
      problems.push([field || "(object)", `schema: ${message}`]);
    }
  }
  const unknown = [];
  for (const r of records) {
    if (r.iterated) continue;
    for (const key of r.keys) {
      if (!r.read.has(key)) unknown.push(r.path ? `${r.path}.${key}` : key);
    }
  }
  // Only the outermost: what lies under an unknown field is unknown too.
  for (const path of unknown) {
    if (!unknown.some((u) => u !== path && (path.startsWith(`${u}.`) || path.startsWith(`${u}[`)))) {
      problems.push([path, "schema: unknown field"]);
    }
  }
  return problems;
}

// Array elements are named by their `name` where they have one
// (containers[worker], volumes[data]), else by index.
const elementName = (v, i) => (v && typeof v === "object" && typeof v.name === "string" ? v.name : i);

// "/spec/template/spec/containers/0/ports" -> "spec.template.spec.containers[worker].ports"
function fieldPath(data, pointer) {
  let path = "";
  let node = data;
  for (const raw of pointer.split("/").slice(1)) {
    const key = raw.replaceAll("~1", "/").replaceAll("~0", "~");
    if (Array.isArray(node)) {
      path += `[${elementName(node[Number(key)], key)}]`;
      node = node[Number(key)];
    } else {
      path += path ? `.${key}` : key;
      node = node?.[key];
    }
  }
  return path;
}

// ---------------------------------------------------------------- helpers

// A quantity ("500m", "2Gi", "1e3") in base units; NaN when malformed.
function quantity(q) {
  const m = String(q).match(/^([+-]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$/);
  if (!m) return NaN;
  const scale = { m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18,
                  Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60 };
  return Number(m[1]) * (m[2] ? scale[m[2]] : 1);
}

const matches = (selector, labels) =>
  selector && Object.keys(selector).length > 0 &&
  Object.entries(selector).every(([k, v]) => labels?.[k] === v);

// The pod template of a workload, with the path to it.
function podTemplateOf(obj) {
  switch (obj.kind) {
    case "Deployment": case "StatefulSet": case "DaemonSet": case "ReplicaSet": case "Job":
      return obj.spec?.template ? { template: obj.spec.template, path: "spec.template" } : null;
    case "CronJob":
      return obj.spec?.jobTemplate?.spec?.template
        ? { template: obj.spec.jobTemplate.spec.template, path: "spec.jobTemplate.spec.template" } : null;
    case "Pod":
      return { template: { metadata: obj.metadata, spec: obj.spec }, path: "" };
    default:
      return null;
  }
}

// "$(VAR)" references resolved from the container's literal env values.
function expand(text, env) {
  return String(text).replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (whole, name) => env.get(name) ?? whole);
}

// The value of `--flag V` or `--flag=V` in an argument list.
function flagValue(args, flag) {
  for (let i = 0; i < args.length; i++) {
    if (args[i] === flag && i + 1 < args.length) return args[i + 1];
    if (String(args[i]).startsWith(`${flag}=`)) return String(args[i]).slice(flag.length + 1);
  }
  return undefined;
}

// ---------------------------------------------------------------- checks

function validate(docs) {
  const problems = [];
  const report = (obj, field, message) =>
    problems.push(`${obj?.kind ?? "?"}/${obj?.metadata?.name ?? "?"}: ${field}: ${message}`);

  const objects = [];
  const seen = new Set();
  for (const obj of docs) {
    if (obj === null || obj === undefined) continue;
    if (typeof obj !== "object" || Array.isArray(obj)) {
      problems.push(`(document): not an object`);
      continue;
    }
    if (!obj.apiVersion || !obj.kind || !obj.metadata?.name) {
      report(obj, "apiVersion/kind/metadata.name", "missing");
      continue;
    }
    const id = `${obj.kind}/${obj.metadata.namespace ?? ""}/${obj.metadata.name}`;
    if (seen.has(id)) report(obj, "metadata.name", "duplicate object");
    seen.add(id);
    objects.push(obj);
    const Model = models.get(`${obj.apiVersion}/${obj.kind}`);
    if (!Model) {
      report(obj, "kind", `unknown kind ${obj.kind} in ${obj.apiVersion} (no schema to validate it against)`);
      continue;
    }
    const ga = gaVersionOf(obj.apiVersion, obj.kind);
    if (ga) report(obj, "apiVersion", `${obj.apiVersion} is not a GA version; use ${ga}`);
    for (const [field, message] of validateSchema(Model, obj)) report(obj, field, message);
  }

  const byKind = (kind) => objects.filter((o) => o.kind === kind);
  const names = (kind) => new Set(byKind(kind).map((o) => o.metadata.name));
  const workloads = objects.map((o) => ({ obj: o, ...podTemplateOf(o) })).filter((w) => w.template);

  // Secrets the render provides, with their keys where known.
  const secrets = new Map(Object.entries(USER_SECRETS));
  for (const s of byKind("Secret")) {
    secrets.set(s.metadata.name, [...Object.keys(s.data ?? {}), ...Object.keys(s.stringData ?? {})]);
  }
  for (const c of byKind("Certificate")) {
    if (c.spec?.secretName) secrets.set(c.spec.secretName, ["tls.crt", "tls.key", "ca.crt"]);
  }
  const pvcs = names("PersistentVolumeClaim");
  const configMaps = names("ConfigMap");
  const serviceAccounts = new Map(byKind("ServiceAccount").map((s) => [s.metadata.name, s]));

  const checkSecret = (obj, field, name, key) => {
    if (!secrets.has(name)) {
      report(obj, field, `Secret ${name} is neither in the render nor a documented user Secret (${Object.keys(USER_SECRETS).join(", ")})`);
    } else if (key !== undefined && secrets.get(name).length > 0 && !secrets.get(name).includes(key)) {
      report(obj, field, `Secret ${name} has no key ${key} (keys: ${secrets.get(name).join(", ")})`);
    }
  };

  for (const { obj, template, path } of workloads) {
    const at = (f) => (path ? `${path}.${f}` : f);
    const spec = template.spec ?? {};
    const labels = template.metadata?.labels ?? {};

    if (obj.kind !== "Pod" && obj.kind !== "Job" && obj.kind !== "CronJob") {
      const selector = obj.spec?.selector?.matchLabels;
      if (!matches(selector, labels)) report(obj, "spec.selector.matchLabels", "does not match the pod template's labels");
    }

    // Service account: present in the render, and no API token mounted.
    const saName = spec.serviceAccountName;
    if (!saName) {
      report(obj, at("spec.serviceAccountName"), "missing (the namespace's default account would be used)");
    } else if (!serviceAccounts.has(saName)) {
      report(obj, at("spec.serviceAccountName"), `ServiceAccount ${saName} is not in the render`);
    }
    const automount = spec.automountServiceAccountToken ?? serviceAccounts.get(saName)?.automountServiceAccountToken;
    if (automount !== false) report(obj, at("spec.automountServiceAccountToken"), "must be false (strata never calls the API)");

    // Volumes and what they reference.
    const volumes = new Set();
    (spec.volumes ?? []).forEach((v, i) => {
      const vf = at(`spec.volumes[${v.name}]`);
      volumes.add(v.name);
      if (v.secret) {
        checkSecret(obj, `${vf}.secret.secretName`, v.secret.secretName);
        (v.secret.items ?? []).forEach((item) => checkSecret(obj, `${vf}.secret.items`, v.secret.secretName, item.key));
      }
      (v.projected?.sources ?? []).forEach((src, j) => {
        if (src.secret) {
          checkSecret(obj, `${vf}.projected.sources[${j}].secret.name`, src.secret.name);
          (src.secret.items ?? []).forEach((item) =>
            checkSecret(obj, `${vf}.projected.sources[${j}].secret.items`, src.secret.name, item.key));
        }
        if (src.configMap && !configMaps.has(src.configMap.name)) {
          report(obj, `${vf}.projected.sources[${j}].configMap.name`, `ConfigMap ${src.configMap.name} is not in the render`);
        }
      });
      if (v.persistentVolumeClaim && !pvcs.has(v.persistentVolumeClaim.claimName)) {
        report(obj, `${vf}.persistentVolumeClaim.claimName`, `PersistentVolumeClaim ${v.persistentVolumeClaim.claimName} is not in the render`);
      }
      if (v.configMap && !configMaps.has(v.configMap.name)) {
        report(obj, `${vf}.configMap.name`, `ConfigMap ${v.configMap.name} is not in the render`);
      }
    });
    for (const t of obj.spec?.volumeClaimTemplates ?? []) volumes.add(t.metadata?.name);
    (spec.imagePullSecrets ?? []).forEach((s, i) => checkSecret(obj, at(`spec.imagePullSecrets[${i}]`), s.name));

    // Prometheus scrape annotations name a declared port.
    const allPorts = (spec.containers ?? []).flatMap((c) => c.ports ?? []);
    const annotations = template.metadata?.annotations ?? {};
    if (annotations["prometheus.io/scrape"] === "true") {
      const port = Number(annotations["prometheus.io/port"]);
      if (!allPorts.some((p) => p.containerPort === port)) {
        report(obj, at("metadata.annotations.prometheus.io/port"), `${annotations["prometheus.io/port"]} is not a declared containerPort`);
      }
    }

    const pod = spec.securityContext ?? {};
    for (const kind of ["initContainers", "containers"]) {
      for (const c of spec[kind] ?? []) {
        const cf = at(`spec.${kind}[${c.name}]`);
        const res = c.resources ?? {};
        for (const side of ["requests", "limits"]) {
          for (const r of ["cpu", "memory"]) {
            const v = res[side]?.[r];
            if (v === undefined) report(obj, `${cf}.resources.${side}.${r}`, "missing");
            else if (Number.isNaN(quantity(v))) report(obj, `${cf}.resources.${side}.${r}`, `malformed quantity ${v}`);
          }
        }
        for (const r of ["cpu", "memory"]) {
          const req = quantity(res.requests?.[r]);
          const lim = quantity(res.limits?.[r]);
          if (req > lim) report(obj, `${cf}.resources.requests.${r}`, `${res.requests[r]} is above the limit ${res.limits[r]}`);
        }

        const sc = c.securityContext;
        if (!sc) {
          report(obj, `${cf}.securityContext`, "missing");
        } else {
          if ((sc.runAsNonRoot ?? pod.runAsNonRoot) !== true) report(obj, `${cf}.securityContext.runAsNonRoot`, "must be true");
          if ((sc.runAsUser ?? pod.runAsUser) === 0) report(obj, `${cf}.securityContext.runAsUser`, "must not be 0");
          if (sc.readOnlyRootFilesystem !== true) report(obj, `${cf}.securityContext.readOnlyRootFilesystem`, "must be true");
          if (sc.allowPrivilegeEscalation !== false) report(obj, `${cf}.securityContext.allowPrivilegeEscalation`, "must be false");
          if (sc.privileged === true) report(obj, `${cf}.securityContext.privileged`, "must not be true");
          if (!(sc.capabilities?.drop ?? []).includes("ALL")) report(obj, `${cf}.securityContext.capabilities.drop`, "must include ALL");
          if ((sc.capabilities?.add ?? []).length > 0) report(obj, `${cf}.securityContext.capabilities.add`, "must be empty");
          const seccomp = (sc.seccompProfile ?? pod.seccompProfile)?.type;
          if (seccomp !== "RuntimeDefault" && seccomp !== "Localhost") {
            report(obj, `${cf}.securityContext.seccompProfile.type`, "must be RuntimeDefault (or Localhost)");
          }
        }

        for (const [i, m] of (c.volumeMounts ?? []).entries()) {
          if (!volumes.has(m.name)) report(obj, `${cf}.volumeMounts[${i}].name`, `no volume named ${m.name}`);
        }
        for (const [i, e] of (c.env ?? []).entries()) {
          const ref = e.valueFrom?.secretKeyRef;
          if (ref && ref.optional !== true) checkSecret(obj, `${cf}.env[${e.name}].valueFrom.secretKeyRef`, ref.name, ref.key);
          const cm = e.valueFrom?.configMapKeyRef;
          if (cm && cm.optional !== true && !configMaps.has(cm.name)) {
            report(obj, `${cf}.env[${e.name}].valueFrom.configMapKeyRef`, `ConfigMap ${cm.name} is not in the render`);
          }
        }
        for (const [i, e] of (c.envFrom ?? []).entries()) {
          if (e.secretRef && e.secretRef.optional !== true) checkSecret(obj, `${cf}.envFrom[${i}].secretRef`, e.secretRef.name);
        }

        // Ports: probes and listen flags name ports the container declares.
        const ports = c.ports ?? [];
        const declared = (port) =>
          typeof port === "number" ? ports.some((p) => p.containerPort === port) : ports.some((p) => p.name === port);
        for (const probe of ["livenessProbe", "readinessProbe", "startupProbe"]) {
          const p = c[probe];
          if (!p) continue;
          for (const handler of ["httpGet", "tcpSocket", "grpc"]) {
            const port = p[handler]?.port;
            if (port !== undefined && !declared(port)) {
              report(obj, `${cf}.${probe}.${handler}.port`, `${port} is not a declared containerPort of ${c.name}`);
            }
          }
        }
        const env = new Map((c.env ?? []).filter((e) => typeof e.value === "string").map((e) => [e.name, e.value]));
        const args = [...(c.command ?? []), ...(c.args ?? [])].map((a) => expand(a, env));
        for (const flag of ["--listen", "--metrics-listen"]) {
          const value = flagValue(args, flag);
          if (value === undefined) continue;
          const port = value.slice(value.lastIndexOf(":") + 1);
          if (!/^\d+$/.test(port)) {
            report(obj, `${cf}.args`, `${flag} ${value}: no numeric port`);
          } else if (!declared(Number(port))) {
            report(obj, `${cf}.args`, `${flag} ${value}: port ${port} is not a declared containerPort`);
          }
        }
        // A worker admits jobs up to --max-host-mib of host memory: above
        // the container's limit, a job the worker accepts gets OOM-killed.
        const maxHost = flagValue(args, "--max-host-mib");
        if (maxHost !== undefined) {
          const limit = quantity(res.limits?.memory);
          if (!/^\d+$/.test(maxHost)) {
            report(obj, `${cf}.args`, `--max-host-mib ${maxHost}: not a number`);
          } else if (!(Number(maxHost) * 2 ** 20 < limit)) {
            report(obj, `${cf}.args`, `--max-host-mib ${maxHost} is not below resources.limits.memory ${res.limits?.memory}`);
          }
        }
      }
    }
  }

  // Services: the selector finds pods, and targetPorts are ports they declare.
  for (const svc of byKind("Service")) {
    const selector = svc.spec?.selector;
    if (!selector || Object.keys(selector).length === 0) {
      report(svc, "spec.selector", "missing");
      continue;
    }
    const selected = workloads.filter((w) => matches(selector, w.template.metadata?.labels));
    if (selected.length === 0) {
      report(svc, "spec.selector", `${JSON.stringify(selector)} matches no pod template in the render`);
      continue;
    }
    const podPorts = selected.flatMap((w) => (w.template.spec?.containers ?? []).flatMap((c) => c.ports ?? []));
    (svc.spec.ports ?? []).forEach((p, i) => {
      const target = p.targetPort ?? p.port;
      const ok = typeof target === "number"
        ? podPorts.some((cp) => cp.containerPort === target)
        : podPorts.some((cp) => cp.name === target);
      if (!ok) report(svc, `spec.ports[${p.name ?? i}].targetPort`, `${target} matches no containerPort of the selected pods`);
    });
  }

  // StatefulSets name a headless Service that selects their pods.
  for (const sts of byKind("StatefulSet")) {
    const svc = byKind("Service").find((s) => s.metadata.name === sts.spec?.serviceName);
    if (!svc) report(sts, "spec.serviceName", `Service ${sts.spec?.serviceName} is not in the render`);
    else if (!matches(svc.spec?.selector, sts.spec?.template?.metadata?.labels)) {
      report(sts, "spec.serviceName", `Service ${svc.metadata.name} does not select this StatefulSet's pods`);
    }
  }

  // PodDisruptionBudgets and NetworkPolicies select pods that exist.
  const selectsSome = (selector) => workloads.some((w) => matches(selector, w.template.metadata?.labels));
  for (const pdb of byKind("PodDisruptionBudget")) {
    if (!selectsSome(pdb.spec?.selector?.matchLabels)) report(pdb, "spec.selector", "matches no pod template in the render");
  }
  for (const np of byKind("NetworkPolicy")) {
    const sel = np.spec?.podSelector?.matchLabels;
    if (sel && Object.keys(sel).length > 0 && !selectsSome(sel)) {
      report(np, "spec.podSelector", "matches no pod template in the render");
    }
    for (const dir of ["ingress", "egress"]) {
      (np.spec?.[dir] ?? []).forEach((rule, i) => {
        (rule[dir === "ingress" ? "from" : "to"] ?? []).forEach((peer, j) => {
          if (peer.podSelector && !peer.namespaceSelector) {
            const ps = peer.podSelector.matchLabels;
            if (ps && Object.keys(ps).length > 0 && !selectsSome(ps)) {
              report(np, `spec.${dir}[${i}].${dir === "ingress" ? "from" : "to"}[${j}].podSelector`, "matches no pod template in the render");
            }
          }
        });
      });
    }
  }

  // cert-manager: issuers named by certificates exist; CA secrets exist.
  const issuers = names("Issuer");
  for (const cert of byKind("Certificate")) {
    const ref = cert.spec?.issuerRef;
    if (ref && (ref.kind ?? "Issuer") === "Issuer" && !issuers.has(ref.name)) {
      report(cert, "spec.issuerRef.name", `Issuer ${ref.name} is not in the render`);
    }
  }
  for (const issuer of byKind("Issuer")) {
    if (issuer.spec?.ca?.secretName) checkSecret(issuer, "spec.ca.secretName", issuer.spec.ca.secretName);
  }

  if (objects.length === 0) problems.push("(render): no objects");
  return { problems, count: objects.length };
}

// ---------------------------------------------------------------- main

function main(argv) {
  const files = argv.length > 0 ? argv : ["-"];
  let failed = false;
  for (const file of files) {
    const label = file === "-" ? "stdin" : file;
    let text;
    try {
      text = readFileSync(file === "-" ? 0 : file, "utf8");
    } catch (e) {
      console.error(`validate: ${label}: ${e.message}`);
      process.exit(2);
    }
    const docs = [];
    const parseProblems = [];
    for (const doc of parseAllDocuments(text)) {
      for (const err of doc.errors) parseProblems.push(`(yaml) ${label}: ${err.message.split("\n")[0]}`);
      docs.push(doc.toJS());
    }
    const { problems, count } = validate(docs);
    problems.unshift(...parseProblems);
    for (const p of problems) console.log(p);
    if (problems.length > 0) {
      console.log(`validate: ${label}: ${problems.length} problem(s) in ${count} object(s)`);
      failed = true;
    } else {
      console.log(`validate: ${label}: ${count} objects, no problems`);
    }
  }
  process.exit(failed ? 1 : 0);
}

main(process.argv.slice(2));
