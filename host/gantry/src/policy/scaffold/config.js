// The config as an object over `defaults`, refusing unknown fields and wrong types with a
// one-line message that names the policy. A thrown string becomes init's error unchanged.
export function parseConfig(policy, config, defaults) {
  let given;
  try {
    given = JSON.parse(config);
  } catch (e) {
    throw `${policy} config: not JSON: ${e.message}`;
  }
  if (given === null || typeof given !== "object" || Array.isArray(given)) {
    throw `${policy} config: expected an object`;
  }
  const values = { ...defaults };
  for (const [key, value] of Object.entries(given)) {
    if (!(key in defaults)) {
      const known = Object.keys(defaults).map((k) => `\`${k}\``).join(" or ");
      throw `${policy} config: unknown field \`${key}\`, expected ${known}`;
    }
    if (typeof value !== typeof defaults[key]) {
      throw `${policy} config: \`${key}\` must be a ${typeof defaults[key]}`;
    }
    if (typeof value === "number" && (!Number.isSafeInteger(value) || value < 0)) {
      throw `${policy} config: \`${key}\` must be a whole number`;
    }
    values[key] = value;
  }
  return values;
}
