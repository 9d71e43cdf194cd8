/**
 * "Run on GPU queue…": a dialog for GPUs, GPU type, time limit, priority, a signal before the
 * end and requeue at the limit (docs/long-jobs.md), a container image (docs/containers.md), and parameters,
 * then `POST jobs` with a notebook job. A 4xx answer reopens the dialog with the message
 * next to the field it names, keeping what was typed. "When would it start?" asks the same
 * request as a what-if (`POST jobs?dry_run=1`, docs/what-if.md) and shows the answer in the
 * dialog: when it would start, nearby choices that start sooner, advice from earlier runs.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { PathExt } from '@jupyterlab/coreutils';
import { Widget } from '@lumino/widgets';
import { APIError, IJob, ISubmitNotebook, IWhatIf, IWhatIfChoice, api } from './api';
import { addFormRows } from './form';
import { formatClock, nowSeconds } from './format';

export interface ISubmitValues {
  gpus: string;
  gpuType: string;
  timeLimit: string;
  priority: string;
  name: string;
  parameters: string;
  signal: string;
  requeue: boolean;
  /** nodes of a multi-node job (Slurm runner only); empty or 1: one node */
  nodes?: string;
  /** container image to run in (docs/containers.md); empty: the site's default, or the host */
  image?: string;
}

const PRIORITIES = ['low', 'normal', 'high', 'urgent'];

/** `key=value` lines into an object; values that read as JSON (numbers, true, lists) are typed. */
export function parseParameters(text: string): { [key: string]: any } {
  const out: { [key: string]: any } = {};
  text.split('\n').forEach((raw, i) => {
    const line = raw.trim();
    if (!line || line.startsWith('#')) {
      return;
    }
    const eq = line.indexOf('=');
    if (eq <= 0) {
      throw new APIError(`line ${i + 1}: expected key=value, got "${line}"`, 400, 'parameters');
    }
    const key = line.slice(0, eq).trim();
    const value = line.slice(eq + 1).trim();
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(key)) {
      throw new APIError(`line ${i + 1}: "${key}" is not a Python name`, 400, 'parameters');
    }
    let parsed: any = value;
    try {
      parsed = JSON.parse(value);
    } catch {
      parsed = value.replace(/^(['"])(.*)\1$/, '$2');
    }
    out[key] = parsed;
  });
  return out;
}

class SubmitForm extends Widget {
  constructor(path: string, types: string[], values: ISubmitValues, error: APIError | null) {
    super();
    this.addClass('jp-GPUJobs-submit');
    const form = document.createElement('form');
    form.className = 'jp-GPUJobs-form';
    form.onsubmit = e => e.preventDefault();
    const intro = document.createElement('p');
    intro.className = 'jp-GPUJobs-formIntro';
    intro.textContent = `Queue ${path} to run on GPUs; its output notebook is saved next to it.`;
    form.append(intro);

    this._gpus = input('number', values.gpus);
    this._gpus.min = '0';
    this._gpus.max = '64';
    this._nodes = input('number', values.nodes ?? '1');
    this._nodes.min = '1';
    this._nodes.title = 'More than one only on a server that hands its jobs to Slurm: GPUs on each node';
    this._type = document.createElement('select');
    for (const t of ['', ...types]) {
      const opt = document.createElement('option');
      opt.value = t;
      opt.textContent = t || 'any type';
      this._type.append(opt);
    }
    this._type.value = types.includes(values.gpuType) ? values.gpuType : '';
    this._time = input('text', values.timeLimit);
    this._time.placeholder = 'e.g. 30m, 2h, 1h30m (empty: server default)';
    this._priority = document.createElement('select');
    for (const p of PRIORITIES) {
      const opt = document.createElement('option');
      opt.value = p;
      opt.textContent = p;
      this._priority.append(opt);
    }
    this._priority.value = values.priority;
    this._name = input('text', values.name);
    this._signal = input('text', values.signal);
    this._signal.placeholder = 'e.g. USR1@5m (empty: none)';
    this._image = input('text', values.image ?? '');
    this._image.placeholder = "e.g. localhost/pytorch:2.3 (empty: the site's default, or the host)";
    this._image.title =
      'Run the notebook in this container image, as you, on its GPUs alone; it must be there already ' +
      '(podman pull or build it first); the kernel needs ipykernel in it';
    this._requeue = input('checkbox', '');
    this._requeue.checked = values.requeue;
    this._requeue.title =
      'At its time limit the job goes back to the queue and resumes after its last completed cell ' +
      '(cells tagged "setup" run again first)';
    this._params = document.createElement('textarea');
    this._params.rows = 4;
    this._params.value = values.parameters;
    this._params.placeholder = 'one key=value per line, e.g.\nepochs=10\nlr=0.001';

    addFormRows(
      form,
      [
        { field: 'gpus', label: 'GPUs', control: this._gpus },
        { field: 'nodes', label: 'Nodes', control: this._nodes },
        { field: 'gpu_type', label: 'GPU type', control: this._type },
        { field: 'time_limit', label: 'Time limit', control: this._time },
        { field: 'priority', label: 'Priority', control: this._priority },
        { field: 'name', label: 'Job name', control: this._name },
        { field: 'signal', label: 'Signal before the end', control: this._signal },
        { field: 'image', label: 'Container image', control: this._image },
        {
          field: 'requeue',
          label: 'Requeue at the time limit',
          control: this._requeue,
          alsoFor: ['max_requeues']
        },
        { field: 'parameters', label: 'Parameters', control: this._params, alsoFor: ['payload'] }
      ],
      error
    );
    const ask = document.createElement('button');
    ask.type = 'button';
    ask.className = 'jp-mod-styled jp-mod-reject jp-GPUJobs-whatIfButton';
    ask.textContent = 'When would it start?';
    ask.title = 'Ask the queue when this request would start, and what would start sooner (nothing is submitted)';
    const answer = document.createElement('div');
    answer.className = 'jp-GPUJobs-whatIf';
    answer.setAttribute('aria-live', 'polite');
    ask.onclick = async () => {
      answer.textContent = 'asking the queue…';
      try {
        answer.replaceChildren(...whatIfLines(await api.whatIf(buildRequest(path, this.getValue())), nowSeconds()));
      } catch (e) {
        const field = e instanceof APIError && e.field ? `${e.field}: ` : '';
        answer.textContent = `${field}${e instanceof Error ? e.message : String(e)}`;
      }
      answer.scrollIntoView({ block: 'nearest' }); // below the fields, in a dialog that scrolls
    };
    form.append(ask, answer);
    this.node.append(form);
  }

  getValue(): ISubmitValues {
    return {
      gpus: this._gpus.value,
      gpuType: this._type.value,
      timeLimit: this._time.value,
      priority: this._priority.value,
      name: this._name.value,
      parameters: this._params.value,
      signal: this._signal.value,
      requeue: this._requeue.checked,
      nodes: this._nodes.value,
      image: this._image.value
    };
  }

  private _gpus: HTMLInputElement;
  private _nodes: HTMLInputElement;
  private _type: HTMLSelectElement;
  private _time: HTMLInputElement;
  private _priority: HTMLSelectElement;
  private _name: HTMLInputElement;
  private _signal: HTMLInputElement;
  private _image: HTMLInputElement;
  private _requeue: HTMLInputElement;
  private _params: HTMLTextAreaElement;
}

/** "now", "by 15:40" (a bound from time limits: sooner if the jobs ahead end sooner), "unknown". */
function when(epoch: number | null, now: number): string {
  if (epoch === null) {
    return 'unknown';
  }
  return epoch - now < 1 ? 'now' : `by ${formatClock(epoch, epoch - now >= 20 * 3600)}`;
}

/** "1xA100", "a 0.5 share of A100" (with its limit when that is what changed). */
export function choiceText(c: IWhatIfChoice): string {
  const model = (c.gpu_type || '').replace('NVIDIA ', '');
  let text = c.gpus > 0 && c.gpus < 1 ? `a ${c.gpus} share${model ? ` of ${model}` : ''}` : `${c.gpus}x${model || 'GPU'}`;
  if (c.change === 'a shorter time limit') {
    text += ` with ${Math.round(c.time_limit_s / 60)}m`;
  }
  return text;
}

/** The answer of a what-if as lines: "1xA100 by 15:40; a 0.5 share now; 1xT4 now", advice. */
export function whatIfLines(a: IWhatIf, now: number): HTMLElement[] {
  const line = (cls: string, text: string): HTMLElement => {
    const el = document.createElement('div');
    el.className = cls;
    el.textContent = text;
    return el;
  };
  const asked = { ...a.request, expected_start: a.expected_start };
  const choices = [asked, ...a.alternatives].map(c => `${choiceText(c)} ${when(c.expected_start ?? null, now)}`);
  const start = when(a.expected_start, now);
  const latest = start.startsWith('by ') ? ' at the latest' : '';
  const out = [line('jp-GPUJobs-whatIfStart', `Would start ${start}${latest} (nothing was submitted)`)];
  out.push(line('jp-GPUJobs-whatIfChoices', choices.join('; ')));
  if (a.advice) {
    out.push(line('jp-GPUJobs-whatIfAdvice', `Advice: ${a.advice.text}`));
  }
  if (a.basis) {
    out.push(line('jp-GPUJobs-whatIfBasis', `Estimated from ${a.basis}`));
  }
  return out;
}

function input(type: string, value: string): HTMLInputElement {
  const el = document.createElement('input');
  el.type = type;
  el.value = value;
  return el;
}

export function buildRequest(path: string, v: ISubmitValues): ISubmitNotebook {
  const gpus = Number(v.gpus);
  if (!Number.isInteger(gpus) || gpus < 0) {
    throw new APIError(`expected a whole number of GPUs, got "${v.gpus}"`, 400, 'gpus');
  }
  const request: ISubmitNotebook = {
    kind: 'notebook',
    name: v.name.trim() || PathExt.basename(path, '.ipynb'),
    gpus,
    gpu_type: v.gpuType || null,
    time_limit: v.timeLimit.trim() || null,
    priority: v.priority || 'normal',
    payload: { notebook: path, parameters: parseParameters(v.parameters) }
  };
  if (v.signal.trim()) {
    request.signal = v.signal.trim();
  }
  if (v.requeue) {
    request.requeue = true;
  }
  if ((v.image ?? '').trim()) {
    request.image = (v.image ?? '').trim();
  }
  const nodes = Number((v.nodes ?? '').trim() || '1');
  if (!Number.isInteger(nodes) || nodes < 1) {
    throw new APIError(`expected a whole number of nodes, got "${v.nodes}"`, 400, 'nodes');
  }
  if (nodes > 1) {
    request.nodes = nodes;
  }
  return request;
}

/** Ask, submit, and answer the job (or null when the user cancelled). */
export async function runOnGPUQueue(path: string): Promise<IJob | null> {
  let types: string[] = [];
  try {
    const inventory = await api.gpus();
    types = Array.from(new Set(inventory.gpus.map(g => g.name))).sort();
  } catch {
    types = [];
  }
  let values: ISubmitValues = {
    gpus: '1',
    gpuType: '',
    timeLimit: '1h',
    priority: 'normal',
    name: PathExt.basename(path, '.ipynb'),
    parameters: '',
    signal: '',
    requeue: false
  };
  let error: APIError | null = null;
  for (;;) {
    const form = new SubmitForm(path, types, values, error);
    const result = await showDialog<ISubmitValues>({
      title: 'Run on GPU queue',
      body: form,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Submit' })],
      focusNodeSelector: 'input'
    });
    if (!result.button.accept || !result.value) {
      return null;
    }
    values = result.value;
    try {
      return await api.submit(buildRequest(path, values));
    } catch (e) {
      if (e instanceof APIError && e.status >= 400 && e.status < 500) {
        error = e;
        continue;
      }
      throw e;
    }
  }
}
