/**
 * Charts of the dashboard: Vega-Lite specs (the grammar JupyterLab's own Vega renderer and
 * Altair speak) rendered with vega-embed, themed from JupyterLab's CSS variables so light and
 * dark themes both work. Vega is loaded on first use (its own chunk): the sidebar never pays
 * for it.
 */
import * as React from 'react';
import type { VisualizationSpec } from 'vega-embed';

type Embed = typeof import('vega-embed').default;
type View = Awaited<ReturnType<Embed>>['view'];

let embedding: Promise<Embed> | null = null;

function loadEmbed(): Promise<Embed> {
  if (!embedding) {
    embedding = import('vega-embed').then(m => m.default);
  }
  return embedding;
}

function cssVar(name: string, fallback: string): string {
  const value = getComputedStyle(document.body).getPropertyValue(name).trim();
  return value || fallback;
}

export function isDarkTheme(): boolean {
  return document.body.dataset.jpThemeLight === 'false';
}

/** GPU series colours: distinct on the light and the dark background alike. */
const LIGHT_SERIES = ['#1f77b4', '#e4572e', '#2ca02c', '#9467bd', '#d4a017', '#17becf', '#e377c2', '#7f7f7f'];
const DARK_SERIES = ['#58a6ff', '#ff7b72', '#56d364', '#d2a8ff', '#e3b341', '#39c5cf', '#f778ba', '#b1bac4'];

export function seriesColors(): string[] {
  return isDarkTheme() ? DARK_SERIES : LIGHT_SERIES;
}

/** The Vega config of the current JupyterLab theme. */
export function themeConfig(): Record<string, any> {
  const fg1 = cssVar('--jp-ui-font-color1', '#333');
  const fg2 = cssVar('--jp-ui-font-color2', '#777');
  const grid = cssVar('--jp-border-color2', '#ddd');
  const domain = cssVar('--jp-border-color1', '#bbb');
  const font = cssVar('--jp-ui-font-family', 'sans-serif');
  return {
    background: null,
    font,
    padding: { left: 2, right: 8, top: 6, bottom: 2 },
    view: { stroke: null },
    axis: {
      labelColor: fg2,
      titleColor: fg2,
      gridColor: grid,
      gridOpacity: 0.7,
      domainColor: domain,
      tickColor: domain,
      labelFontSize: 10,
      titleFontSize: 10,
      titleFontWeight: 'normal',
      labelFont: font,
      titleFont: font
    },
    legend: {
      labelColor: fg1,
      titleColor: fg2,
      labelFontSize: 10,
      titleFontSize: 10,
      titleFontWeight: 'normal',
      orient: 'bottom',
      direction: 'horizontal',
      symbolStrokeWidth: 3,
      labelFont: font,
      titleFont: font
    },
    title: { color: fg1, font },
    range: { category: seriesColors() },
    line: { strokeWidth: 1.8 },
    bar: { color: cssVar('--jp-brand-color1', '#1976d2') },
    area: { color: cssVar('--jp-brand-color1', '#1976d2') },
    text: { color: fg1, font }
  };
}

function setSignals(view: View, signals?: { [name: string]: number }): void {
  for (const [name, value] of Object.entries(signals ?? {})) {
    view.signal(name, value);
  }
}

export interface IChartProps {
  /** Name of the chart in the page (data-chart), for tests and styles. */
  name: string;
  /** A Vega-Lite spec whose data is the named data set "table". */
  spec: VisualizationSpec;
  values: any[];
  height: number;
  /** Changes when the JupyterLab theme changes: the chart is drawn again in its colours. */
  theme: string;
  /** What to say where there is nothing to draw yet. */
  empty: string;
  /** A short text of what is drawn (data-summary), and the latest value (data-last). */
  summary?: string;
  last?: string;
  /** Values of the spec's params (e.g. the time window), set with each data set. */
  signals?: { [name: string]: number };
}

/**
 * One chart. The spec is embedded once per theme; new values go into the live view
 * (`view.data`), so updates do not flicker. The width follows the container.
 * With no values there is no view at all, only the `empty` text: Vega given an empty data set
 * computes infinite scale extents (console warnings, and SVG sizes of 1.8e308 the browser
 * rejects), so the chart is embedded once there is something to draw, and again after a time
 * with nothing (a range switch empties the charts until its data comes).
 * `data-points` (rows drawn) and `data-version` (data sets drawn so far) tell tests and
 * curious people that it is live.
 */
export function VegaChart(props: IChartProps): React.ReactElement {
  const host = React.useRef<HTMLDivElement>(null);
  const view = React.useRef<View | null>(null);
  const values = React.useRef<any[]>(props.values);
  const signals = React.useRef(props.signals);
  const [version, setVersion] = React.useState(0);
  const [failed, setFailed] = React.useState<string | null>(null);
  values.current = props.values;
  signals.current = props.signals;
  const hasValues = props.values.length > 0;

  React.useEffect(() => {
    let disposed = false;
    const node = host.current;
    if (!node || !hasValues) {
      return;
    }
    const width = Math.max(120, node.clientWidth);
    const spec = {
      ...(props.spec as any),
      $schema: 'https://vega.github.io/schema/vega-lite/v5.json',
      // the values in the spec: an embed with an empty "table" would warn as described above
      data: { name: 'table', values: values.current },
      width,
      height: props.height,
      autosize: { type: 'fit-x', contains: 'padding' },
      config: themeConfig()
    };
    let observer: ResizeObserver | null = null;
    loadEmbed()
      .then(embed => embed(node, spec, { actions: false, renderer: 'svg', tooltip: { theme: isDarkTheme() ? 'dark' : 'light' } }))
      .then(async result => {
        if (disposed) {
          result.finalize();
          return;
        }
        view.current = result.view;
        setSignals(result.view, signals.current);
        await result.view.runAsync();
        setVersion(v => v + 1);
        observer = new ResizeObserver(() => {
          const w = Math.max(120, node.clientWidth);
          if (view.current && Math.abs(view.current.width() - w) > 2) {
            void view.current.width(w).runAsync();
          }
        });
        observer.observe(node);
      })
      .catch(error => {
        console.error('gpujobs: cannot draw the chart', props.name, error);
        setFailed(String(error?.message ?? error));
      });
    return () => {
      disposed = true;
      observer?.disconnect();
      view.current?.finalize();
      view.current = null;
      node.replaceChildren();
    };
  }, [props.theme, props.spec, hasValues]);

  React.useEffect(() => {
    const v = view.current;
    if (!v || !hasValues) {
      return;
    }
    let stale = false;
    setSignals(v, props.signals);
    if (v.height() !== props.height) {
      v.height(props.height); // bar charts grow with their rows
    }
    void v
      .data('table', props.values)
      .runAsync()
      .then(() => {
        if (!stale) {
          setVersion(n => n + 1);
        }
      });
    return () => {
      stale = true;
    };
  }, [props.values]);

  const empty = props.values.length === 0;
  return (
    <div
      className="jp-GPUDash-chart"
      data-chart={props.name}
      data-points={props.values.length}
      data-version={version}
      data-summary={props.summary}
      data-last={props.last}
    >
      <div ref={host} className="jp-GPUDash-vega" style={{ minHeight: props.height }} />
      {failed && <div className="jp-GPUDash-chartEmpty jp-mod-error">Cannot draw this chart: {failed}</div>}
      {empty && !failed && <div className="jp-GPUDash-chartEmpty">{props.empty}</div>}
    </div>
  );
}
