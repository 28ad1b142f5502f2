// Small shared pieces: time formatting, the status line, the confirmation dialog.
import type { ComponentChildren } from "preact";
import { useEffect, useRef } from "preact/hooks";

export const time = (ms: number) => new Date(ms).toLocaleTimeString();
export const dateTime = (ms: number) => new Date(ms).toLocaleString();
export const short = (sha: string) => sha.slice(0, 12);

/** `ms` as `45 s`, `12 min` or `3 h 5 min`: how long people read a wait. */
export function duration(ms: number) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s} s`;
  const min = Math.round(s / 60);
  if (min < 60) return `${min} min`;
  return `${Math.floor(min / 60)} h ${min % 60} min`;
}

/** A past moment as `12 min ago` (`just now` under a second), the clock time on hover. */
export function Ago({ ms, now = Date.now() }: { ms: number; now?: number }) {
  return <time dateTime={new Date(ms).toISOString()} title={dateTime(ms)}>{now - ms < 1000 ? "just now" : `${duration(now - ms)} ago`}</time>;
}

export function Status({ error, ok }: { error?: string | null; ok?: string | null }) {
  return (
    <div>
      {error && <p class="error" role="alert">{error}</p>}
      {ok && <p class="ok" role="status">{ok}</p>}
    </div>
  );
}

/** Asks before an admin action; the caller runs it on confirm. */
export function Confirm({ open, title, children, onConfirm, onCancel }: {
  open: boolean; title: string; children: ComponentChildren; onConfirm: () => void; onCancel: () => void;
}) {
  const ref = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    const d = ref.current;
    if (!d) return;
    if (open && !d.open) d.showModal();
    if (!open && d.open) d.close();
  }, [open]);
  return (
    <dialog ref={ref} aria-labelledby="confirm-title" onCancel={onCancel}>
      <h2 id="confirm-title">{title}</h2>
      <div>{children}</div>
      <div class="row">
        <button type="button" class="primary" onClick={onConfirm}>Confirm</button>
        <button type="button" onClick={onCancel}>Cancel</button>
      </div>
    </dialog>
  );
}
