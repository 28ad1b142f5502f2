// team-quota, in JavaScript: a queue runs within its nominal GPU quota; past it, it may borrow
// GPUs that other queues of its cohort leave idle, up to its borrowing limit; past that, it is
// refused. Config (optional): {"borrowing": true, "max_borrow_gpus": {"queue-name": 64}}. The
// same answers as plugins/team-quota (Rust); plugins/cases/team-quota checks both.
//
// WIT u64 values (every `resources` field) arrive as BigInt, so the arithmetic is BigInt too.

import { resolve } from "gantry:policy/host@0.1.0";

let borrowing = true;
let maxBorrowGpus = new Map();

function refuse(message) {
  // A thrown value becomes the `err` of init's result: the admin sees this message unchanged.
  throw `team-quota config: ${message}`;
}

function min(a, b) {
  return a < b ? a : b;
}

export const quotaPolicy = {
  init(config) {
    let given;
    try {
      given = JSON.parse(config);
    } catch (e) {
      refuse(`not JSON: ${e.message}`);
    }
    if (given === null || typeof given !== "object" || Array.isArray(given)) {
      refuse("expected an object");
    }
    borrowing = true;
    maxBorrowGpus = new Map();
    for (const [key, value] of Object.entries(given)) {
      if (key === "borrowing") {
        if (typeof value !== "boolean") refuse("`borrowing` must be true or false");
        borrowing = value;
      } else if (key === "max_borrow_gpus") {
        if (value === null || typeof value !== "object" || Array.isArray(value)) {
          refuse("`max_borrow_gpus` must map queue names to GPU counts");
        }
        for (const [queue, cap] of Object.entries(value)) {
          if (!Number.isSafeInteger(cap) || cap < 0) {
            refuse(`\`max_borrow_gpus.${queue}\` must be a whole number of GPUs`);
          }
          maxBorrowGpus.set(queue, BigInt(cap));
        }
      } else {
        refuse(`unknown field \`${key}\`, expected \`borrowing\` or \`max_borrow_gpus\``);
      }
    }
    return { name: "team-quota", version: "0.1.0", reasons: [] };
  },

  admit(job, queue, cohort) {
    const name = resolve(queue.name);
    const wanted = queue.used.gpus + job.total.gpus;
    if (wanted <= queue.nominal.gpus) {
      return { tag: "admit" };
    }
    const borrow = wanted - queue.nominal.gpus;
    if (!borrowing) {
      return {
        tag: "deny",
        val: `queue ${name} would use ${wanted} GPUs, over its quota of ${queue.nominal.gpus}, and borrowing is off`,
      };
    }
    const declared = queue.borrowingLimit ? queue.borrowingLimit.gpus : 2n ** 64n - 1n;
    const cap = maxBorrowGpus.get(name);
    const limit = cap === undefined ? declared : min(cap, declared);
    if (borrow > limit) {
      return {
        tag: "deny",
        val: `queue ${name} would borrow ${borrow} GPUs, over its borrowing limit of ${limit}`,
      };
    }
    if (!cohort) {
      return {
        tag: "deny",
        val: `queue ${name} is at its quota of ${queue.nominal.gpus} GPUs and has no cohort to borrow from`,
      };
    }
    let idle = 0n;
    for (const other of cohort.queues) {
      if (other.name === queue.name) continue;
      const unused = other.nominal.gpus > other.used.gpus ? other.nominal.gpus - other.used.gpus : 0n;
      idle += other.lendingLimit ? min(unused, other.lendingLimit.gpus) : unused;
    }
    if (borrow > idle) {
      return {
        tag: "deny",
        val: `queue ${name} would borrow ${borrow} GPUs, but its cohort has only ${idle} idle`,
      };
    }
    return { tag: "admit-borrowing", val: { gpus: borrow, cpuMilli: 0n, memoryMib: 0n } };
  },
};
