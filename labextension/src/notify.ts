/**
 * "Notify me…": a dialog for my e-mail and webhook notifications (`PUT notifications`): the
 * address, the webhook URL and which events. A 4xx answer reopens the dialog with the message
 * next to the field it names, keeping what was typed.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';
import { APIError, INotifications, api } from './api';
import { addFormRows } from './form';

export const EVENT_LABELS: { [event: string]: string } = {
  started: 'a job starts',
  ended: 'a job ends (completed or cancelled)',
  failed: 'a job fails, times out or is lost',
  warning: 'a job nears its time limit',
  finding: 'the monitor finds something about me or my job'
};

interface INotifyValues {
  email: string;
  webhook: string;
  events: string[];
}

class NotifyForm extends Widget {
  constructor(current: INotifications, values: INotifyValues, error: APIError | null) {
    super();
    this.addClass('jp-GPUJobs-notifyForm');
    const form = document.createElement('form');
    form.className = 'jp-GPUJobs-form';
    form.onsubmit = e => e.preventDefault();
    const intro = document.createElement('p');
    intro.className = 'jp-GPUJobs-formIntro';
    intro.textContent =
      'Be told away from JupyterLab: by e-mail, or in a chat through a Slack or Mattermost incoming webhook. ' +
      'Leave both empty to turn notifications off.';
    form.append(intro);

    this._email = input('email', values.email, 'you@example.org');
    if (!current.email_available) {
      this._email.disabled = true;
      this._email.placeholder = 'this server sends no e-mail (no SMTP server set)';
    }
    this._webhook = input('url', values.webhook, 'https://hooks.slack.com/services/…');
    const hostsHint = current.webhook_hosts.length ? `allowed hosts: ${current.webhook_hosts.join(', ')}` : '';
    const events = document.createElement('div');
    events.className = 'jp-GPUJobs-notifyEvents';
    const kinds = current.kinds.length ? current.kinds : Object.keys(EVENT_LABELS);
    for (const kind of kinds) {
      const label = document.createElement('label');
      const box = document.createElement('input');
      box.type = 'checkbox';
      box.value = kind;
      box.name = 'events';
      box.checked = values.events.includes(kind);
      this._events.push(box);
      label.append(box, ` ${EVENT_LABELS[kind] ?? kind}`);
      events.append(label);
    }

    addFormRows(
      form,
      [
        { field: 'email', label: 'E-mail', control: this._email },
        { field: 'webhook', label: 'Webhook URL', control: this._webhook, hint: hostsHint },
        { field: 'events', label: 'Tell me when', control: events }
      ],
      error
    );
    this.node.append(form);
  }

  getValue(): INotifyValues {
    return {
      email: this._email.value,
      webhook: this._webhook.value,
      events: this._events.filter(b => b.checked).map(b => b.value)
    };
  }

  private _email: HTMLInputElement;
  private _webhook: HTMLInputElement;
  private _events: HTMLInputElement[] = [];
}

function input(type: string, value: string, placeholder: string): HTMLInputElement {
  const el = document.createElement('input');
  el.type = type;
  el.value = value;
  el.placeholder = placeholder;
  return el;
}

/** Ask and save my notification settings; answers the new settings (null: cancelled). */
export async function editNotifications(current: INotifications): Promise<INotifications | null> {
  let values: INotifyValues = {
    email: current.email ?? '',
    webhook: current.webhook ?? '',
    events: current.events.length ? current.events : ['ended', 'failed']
  };
  let error: APIError | null = null;
  for (;;) {
    const result = await showDialog<INotifyValues>({
      title: 'Notify me about my GPU jobs',
      body: new NotifyForm(current, values, error),
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Save' })],
      focusNodeSelector: 'input'
    });
    if (!result.button.accept || !result.value) {
      return null;
    }
    values = result.value;
    const body: { email?: string | null; webhook?: string | null; events: string[] } = {
      webhook: values.webhook.trim() || null,
      events: values.events
    };
    if (current.email_available) {
      body.email = values.email.trim() || null;
    }
    try {
      return await api.setNotifications(body);
    } catch (e) {
      if (e instanceof APIError && e.status >= 400 && e.status < 500) {
        error = e;
        continue;
      }
      throw e;
    }
  }
}

/** One line about my settings: "off", or "e-mail to a@b.org and webhook to hooks.slack.com". */
export function describeNotifications(n: INotifications | null): string {
  if (!n || (!n.email && !n.webhook)) {
    return 'Off: you hear about your jobs only here, in JupyterLab.';
  }
  const to: string[] = [];
  if (n.email) {
    to.push(`e-mail to ${n.email}`);
  }
  if (n.webhook) {
    let host = n.webhook;
    try {
      host = new URL(n.webhook).host;
    } catch {
      // keep the text
    }
    to.push(`webhook to ${host}`);
  }
  const events = n.events.length ? n.events.join(', ') : 'nothing';
  return `On: ${to.join(' and ')}, for: ${events}.`;
}
