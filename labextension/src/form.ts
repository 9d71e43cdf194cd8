/**
 * The rows of the panel's dialog forms (submit a notebook, notifications): a label, the
 * control, an optional hint, and the engine's error on the row of the field it names (or
 * under the form when it names none of them).
 */

import { APIError } from './api';

export interface IFormField {
  /** the API field this row edits */
  field: string;
  label: string;
  control: HTMLElement;
  hint?: string;
  /** other API fields whose errors belong to this row (e.g. "payload" for "parameters") */
  alsoFor?: string[];
}

export function addFormRows(form: HTMLElement, fields: IFormField[], error: APIError | null): void {
  const owns = (f: IFormField): boolean =>
    !!error && (error.field === f.field || (f.alsoFor ?? []).includes(error.field ?? ''));
  for (const f of fields) {
    const single =
      f.control instanceof HTMLInputElement ||
      f.control instanceof HTMLSelectElement ||
      f.control instanceof HTMLTextAreaElement;
    if (single) {
      f.control.classList.add('jp-mod-styled');
      f.control.setAttribute('name', f.field);
    }
    // a group of controls (check boxes) is not one label's
    const row = document.createElement(single ? 'label' : 'div');
    row.className = 'jp-GPUJobs-formRow';
    row.dataset.field = f.field;
    const span = document.createElement('span');
    span.className = 'jp-GPUJobs-formLabel';
    span.textContent = f.label;
    row.append(span, f.control);
    if (f.hint) {
      const h = document.createElement('span');
      h.className = 'jp-GPUJobs-hint';
      h.textContent = f.hint;
      row.append(h);
    }
    if (error && owns(f)) {
      // not jp-mod-error: JupyterLab's dialog disables its accept button while any element
      // has that class, and the engine's error is about the value before it was corrected
      row.classList.add('jp-GPUJobs-mod-invalid');
      row.append(errorLine(error, 'span'));
    }
    form.append(row);
  }
  if (error && !fields.some(owns)) {
    form.append(errorLine(error, 'div'));
  }
}

function errorLine(error: APIError, tag: 'span' | 'div'): HTMLElement {
  const msg = document.createElement(tag);
  msg.className = 'jp-GPUJobs-formError';
  msg.textContent = error.message;
  return msg;
}
